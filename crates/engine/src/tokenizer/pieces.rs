//! A vocabulary held compactly: every piece in one string with its end offset, and a hash
//! table of ids found by their piece's text: ~30 bytes a piece. The `tokenizers` crate's BPE
//! keeps two maps of owned strings instead (~130 bytes a piece, its merges aside).

use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};

pub struct Pieces {
    /// Every piece, concatenated in id order.
    text: String,
    /// Piece `i` is `text[ends[i - 1]..ends[i]]` (from 0 for the first).
    ends: Vec<u32>,
    index: HashTable<u32>,
    hasher: DefaultHashBuilder,
}

impl Pieces {
    /// Piece `i` is the `i`th given. A piece that repeats an earlier one takes its text over
    /// (the last id answers `id`), as the crate's and llama.cpp's maps do.
    pub fn new<'a>(pieces: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut text = String::new();
        let mut ends = Vec::new();
        for p in pieces {
            text.push_str(p);
            ends.push(u32::try_from(text.len()).map_err(|_| "vocabulary over 4 GB")?);
        }
        let mut all = Self {
            text,
            ends,
            index: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
        };
        let mut index = HashTable::with_capacity(all.count());
        for id in 0..all.count() as u32 {
            let piece = all.piece(id);
            let slot = index.entry(
                all.hasher.hash_one(piece),
                |&j| all.piece(j) == piece,
                |&j| all.hasher.hash_one(all.piece(j)),
            );
            slot.insert(id);
        }
        all.index = index;
        Ok(all)
    }

    /// Pieces held (the vocabulary's size).
    pub fn count(&self) -> usize {
        self.ends.len()
    }

    /// Text of piece `id` (empty past the end).
    pub fn piece(&self, id: u32) -> &str {
        let i = id as usize;
        match self.ends.get(i) {
            Some(&end) => {
                let start = if i == 0 { 0 } else { self.ends[i - 1] };
                &self.text[start as usize..end as usize]
            }
            None => "",
        }
    }

    pub fn id(&self, piece: &str) -> Option<u32> {
        let hash = self.hasher.hash_one(piece);
        self.index.find(hash, |&j| self.piece(j) == piece).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_round_trip_and_a_repeat_answers_with_its_last_id() {
        let p = Pieces::new(["a", "bc", "", "a", "é"]).unwrap();
        assert_eq!(p.count(), 5);
        assert_eq!((p.piece(1), p.piece(2), p.piece(4)), ("bc", "", "é"));
        assert_eq!(p.id("a"), Some(3));
        assert_eq!(p.id("bc"), Some(1));
        assert_eq!(p.id("é"), Some(4));
        assert_eq!(p.id("x"), None);
        assert_eq!(p.piece(5), "");
    }
}
