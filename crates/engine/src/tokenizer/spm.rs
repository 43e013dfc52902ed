//! SentencePiece BPE as llama.cpp runs it (`llm_tokenizer_spm`), over a compact vocabulary.
//!
//! The text splits into characters; the adjacent pair whose concatenation is a piece with the
//! highest score merges first (ties: leftmost), until no pair is a piece. A symbol that is no
//! piece falls back to its `<0xNN>` byte pieces. Over `Pieces`, Gemma 3's 262k pieces take
//! ~8 MB, where the `tokenizers` crate's BPE (two string maps and a million merges we derived
//! from the scores) took ~70 MB.

use std::collections::BinaryHeap;
use std::ops::Range;

use super::merge::{absorb_next, linked, total_key, Queued, Symbol};
use super::pieces::Pieces;

pub struct Spm {
    pub pieces: Pieces,
    scores: Vec<f32>,
    /// Id of each byte's `<0xNN>` piece.
    bytes: Box<[Option<u32>; 256]>,
    unk: Option<u32>,
}

impl Spm {
    /// Piece `i` has score `scores[i]` (a missing score counts as 0).
    pub fn new(pieces: Pieces, scores: &[f32], unk: Option<u32>) -> Self {
        let n = pieces.count();
        let mut bytes = Box::new([None; 256]);
        for (b, id) in bytes.iter_mut().enumerate() {
            *id = pieces.id(&format!("<0x{b:02X}>"));
        }
        Self {
            scores: (0..n)
                .map(|i| scores.get(i).copied().unwrap_or(0.0))
                .collect(),
            bytes,
            unk: unk.filter(|&u| (u as usize) < n),
            pieces,
        }
    }

    /// Each id of `text` with the byte range it stands for.
    pub fn encode(&self, text: &str) -> Result<Vec<(u32, Range<usize>)>, String> {
        let mut syms = linked(text.char_indices().map(|(at, c)| (at, c.len_utf8())));
        let mut heap = BinaryHeap::new();
        for i in 0..syms.len() {
            self.push_pair(text, &syms, i, &mut heap);
        }
        while let Some(q) = heap.pop() {
            let l = q.pos;
            // Stale: the left side was merged away, or either side grew, since it was queued
            // (a merged-away symbol is unlinked, so `next` is live).
            match syms[l].next {
                Some(r) if syms[l].len > 0 && syms[l].len + syms[r].len == q.tag => {}
                _ => continue,
            }
            absorb_next(&mut syms, l);
            if let Some(pv) = syms[l].prev {
                self.push_pair(text, &syms, pv, &mut heap);
            }
            self.push_pair(text, &syms, l, &mut heap);
        }
        let mut out = Vec::with_capacity(syms.len());
        for s in syms.iter().filter(|s| s.len > 0) {
            let range = s.start..s.start + s.len;
            match self.pieces.id(&text[range.clone()]) {
                Some(id) => out.push((id, range)),
                None => {
                    for (k, b) in text[range.clone()].bytes().enumerate() {
                        let id = self.bytes[b as usize].or(self.unk).ok_or_else(|| {
                            format!("byte 0x{b:02X} has no <0x{b:02X}> piece and there is no unknown piece")
                        })?;
                        out.push((id, range.start + k..range.start + k + 1));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Queue symbol `left` with its next, if their text is a piece (by that piece's score).
    fn push_pair(
        &self,
        text: &str,
        syms: &[Symbol],
        left: usize,
        heap: &mut BinaryHeap<Queued<i32>>,
    ) {
        let Some(right) = syms[left].next else {
            return;
        };
        let (l, r) = (&syms[left], &syms[right]);
        let joined = &text[l.start..r.start + r.len];
        if let Some(id) = self.pieces.id(joined) {
            heap.push(Queued {
                key: total_key(self.scores[id as usize]),
                pos: left,
                tag: joined.len(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(pieces: &[(&str, f32)]) -> Spm {
        let mut all: Vec<(String, f32)> = pieces.iter().map(|&(p, s)| (p.into(), s)).collect();
        all.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0)));
        let scores: Vec<f32> = all.iter().map(|p| p.1).collect();
        let pieces = Pieces::new(all.iter().map(|p| p.0.as_str())).unwrap();
        Spm::new(pieces, &scores, Some(0))
    }

    fn ids(spm: &Spm, text: &str) -> Vec<u32> {
        spm.encode(text).unwrap().into_iter().map(|t| t.0).collect()
    }

    #[test]
    fn highest_score_merges_first_and_ties_go_left() {
        let base = [
            ("<unk>", 0.0),
            ("a", -9.0),
            ("b", -9.0),
            ("c", -9.0),
            ("ab", -1.0),
            ("bc", -2.0),
        ];
        // "abc": "ab" (-1) beats "bc" (-2), and "abc" is reached from "ab" + "c".
        let spm = vocab(&[&base[..], &[("abc", -3.0)]].concat());
        assert_eq!(ids(&spm, "abc"), vec![6]);
        // Without "abc", "ab" wins and "c" stays alone.
        assert_eq!(ids(&vocab(&base), "abc"), vec![4, 3]);
        // "aaa": both pairs score alike; the left one merges.
        let spm = vocab(&[("<unk>", 0.0), ("a", -9.0), ("aa", -1.0)]);
        assert_eq!(ids(&spm, "aaa"), vec![2, 1]);
    }

    #[test]
    fn characters_outside_the_vocabulary_fall_back_to_bytes() {
        let spm = vocab(&[("<unk>", 0.0), ("a", -1.0)]);
        let got = spm.encode("aé").unwrap();
        let e = spm.pieces.id("<0xC3>").unwrap();
        let acute = spm.pieces.id("<0xA9>").unwrap();
        assert_eq!(got, vec![(1, 0..1), (e, 1..2), (acute, 2..3)]);
        assert!(spm.encode("").unwrap().is_empty());
    }

    #[test]
    fn a_character_missing_alone_still_merges_into_a_piece() {
        // llama.cpp merges any adjacent pair whose text is a piece, known alone or not.
        let spm = vocab(&[("<unk>", 0.0), ("x", -1.0), ("xé", -2.0)]);
        assert_eq!(ids(&spm, "xé"), vec![2]);
    }
}
