//! Byte-level BPE over a compact vocabulary: the `tokenizers` crate's merge loop on each
//! pre-token (its pre-tokenizer has already split the text and mapped bytes to characters).
//! Symbols start as characters; the adjacent pair with the lowest merge rank merges first
//! (ties: leftmost), until no pair has a merge. Merges are held as a hash table of id pairs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;
use std::ops::Range;

use hashbrown::{DefaultHashBuilder, HashTable};

use super::merge::{absorb_next, linked, Queued, Symbol};
use super::pieces::Pieces;

pub struct Bpe {
    pub pieces: Pieces,
    merges: HashTable<Merge>,
    hasher: DefaultHashBuilder,
    /// Gemma 4's BPE over raw UTF-8 (`spaced`): a pre-token of newlines only that is a piece
    /// is that piece, unmerged (its merges do not build every newline run its vocabulary
    /// holds); a character that is no piece becomes its bytes' `<0xNN>` pieces.
    spaced: Option<Box<[Option<u32>; 256]>>,
}

/// A symbol that is no piece (spelt by its bytes' pieces at the end).
const UNKNOWN: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Merge {
    left: u32,
    right: u32,
    rank: u32,
    into: u32,
}

impl Bpe {
    /// `merges[r]` is the pair of rank `r`, their concatenation a piece. A pair given twice
    /// keeps its last rank, as the crate's map does. A pair whose side is no piece is never
    /// applied (llama.cpp holds it, but no two symbols match it): a merge of whitespace pieces
    /// read at its first space can name one (`"  " + "  "` as `" "` and `"   "`).
    pub fn new<'a>(
        pieces: Pieces,
        merges: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, String> {
        let hasher = DefaultHashBuilder::default();
        let mut table: HashTable<Merge> = HashTable::new();
        let mut joined = String::new();
        for (rank, (a, b)) in merges.into_iter().enumerate() {
            let id = |p: &str| {
                pieces
                    .id(p)
                    .ok_or_else(|| format!("merge {a:?} {b:?}: {p:?} is not in the vocabulary"))
            };
            let (Some(left), Some(right)) = (pieces.id(a), pieces.id(b)) else {
                continue;
            };
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let m = Merge {
                left,
                right,
                rank: u32::try_from(rank).map_err(|_| "over 4G merges")?,
                into: id(&joined)?,
            };
            let slot = table.entry(
                hasher.hash_one((m.left, m.right)),
                |x| (x.left, x.right) == (m.left, m.right),
                |x| hasher.hash_one((x.left, x.right)),
            );
            slot.insert(m);
        }
        Ok(Self {
            pieces,
            merges: table,
            hasher,
            spaced: None,
        })
    }

    /// This BPE as Gemma 4's (llama.cpp's for its non-byte-level BPE): newline runs that are
    /// pieces taken whole, characters outside the vocabulary as their bytes' `<0xNN>` pieces.
    pub fn spaced(mut self) -> Self {
        let bytes = std::array::from_fn(|b| self.pieces.id(&format!("<0x{b:02X}>")));
        self.spaced = Some(Box::new(bytes));
        self
    }

    fn merge(&self, left: u32, right: u32) -> Option<Merge> {
        self.merges
            .find(self.hasher.hash_one((left, right)), |x| {
                (x.left, x.right) == (left, right)
            })
            .copied()
    }

    /// Each id of the pre-token `word` with the byte range it stands for. A character that is
    /// no piece is left out, as the crate does without an unknown token (a byte-level
    /// vocabulary holds every character its pre-tokenizer makes).
    pub fn encode(&self, word: &str) -> Vec<(u32, Range<usize>)> {
        let newlines = !word.is_empty() && word.bytes().all(|b| b == b'\n');
        if let (true, Some(_), Some(id)) = (newlines, &self.spaced, self.pieces.id(word)) {
            return vec![(id, 0..word.len())];
        }
        let mut ids = Vec::with_capacity(word.len());
        let spans = word.char_indices().filter_map(|(at, c)| {
            let id = self.pieces.id(&word[at..at + c.len_utf8()]);
            ids.push(match (id, &self.spaced) {
                (Some(id), _) => id,
                (None, Some(_)) => UNKNOWN,
                (None, None) => return None,
            });
            Some((at, c.len_utf8()))
        });
        let mut syms = linked(spans);
        let mut heap = BinaryHeap::new();
        for i in 0..syms.len() {
            self.push_pair(&syms, &ids, i, &mut heap);
        }
        while let Some(q) = heap.pop() {
            let pos = q.pos;
            // Stale: the pair at `pos` changed since it was queued.
            let Some(nx) = syms[pos].next.filter(|_| syms[pos].len > 0) else {
                continue;
            };
            if self.merge(ids[pos], ids[nx]).map(|m| m.into as usize) != Some(q.tag) {
                continue;
            }
            absorb_next(&mut syms, pos);
            ids[pos] = q.tag as u32;
            if let Some(pv) = syms[pos].prev {
                self.push_pair(&syms, &ids, pv, &mut heap);
            }
            self.push_pair(&syms, &ids, pos, &mut heap);
        }
        let mut out = Vec::with_capacity(syms.len());
        for (s, &id) in syms.iter().zip(&ids).filter(|(s, _)| s.len > 0) {
            let at = s.start..s.start + s.len;
            match (id, &self.spaced) {
                (UNKNOWN, Some(bytes)) => out.extend(
                    word.as_bytes()[at.clone()]
                        .iter()
                        .filter_map(|&b| bytes[b as usize])
                        .map(|t| (t, at.clone())),
                ),
                _ => out.push((id, at)),
            }
        }
        out
    }

    /// Queue symbol `left` with its next, if they have a merge (lowest rank first).
    fn push_pair(
        &self,
        syms: &[Symbol],
        ids: &[u32],
        left: usize,
        heap: &mut BinaryHeap<Queued<Reverse<u32>>>,
    ) {
        let Some(right) = syms[left].next else {
            return;
        };
        if let Some(m) = self.merge(ids[left], ids[right]) {
            heap.push(Queued {
                key: Reverse(m.rank),
                pos: left,
                tag: m.into as usize,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bpe(pieces: &[&str], merges: &[(&str, &str)]) -> Bpe {
        Bpe::new(
            Pieces::new(pieces.iter().copied()).unwrap(),
            merges.iter().copied(),
        )
        .unwrap()
    }

    fn ids(b: &Bpe, word: &str) -> Vec<u32> {
        b.encode(word).into_iter().map(|t| t.0).collect()
    }

    #[test]
    fn lowest_rank_merges_first_and_ties_go_left() {
        let b = bpe(
            &["a", "b", "c", "ab", "bc", "abc"],
            &[("b", "c"), ("a", "b"), ("a", "bc")],
        );
        // "bc" (rank 0) first, then "a" + "bc".
        assert_eq!(ids(&b, "abc"), vec![5]);
        let b = bpe(&["a", "aa"], &[("a", "a")]);
        assert_eq!(b.encode("aaa"), vec![(1, 0..2), (0, 2..3)]);
        assert!(b.encode("").is_empty());
    }

    #[test]
    fn a_merge_into_no_piece_is_refused_and_one_of_no_pieces_never_applies() {
        let p = Pieces::new(["a", "b"]).unwrap();
        assert!(Bpe::new(p, [("a", "b")]).is_err());
        let p = Pieces::new(["a", "b", "ab"]).unwrap();
        let b = Bpe::new(p, [("x", "ab"), ("a", "b")]).unwrap();
        assert_eq!(b.encode("ab"), vec![(2, 0..2)]);
    }
}
