//! Byte-level BPE over a compact vocabulary: the `tokenizers` crate's merge loop on each
//! pre-token (its pre-tokenizer has already split the text and mapped bytes to characters).
//! Symbols start as characters; the adjacent pair with the lowest merge rank merges first
//! (ties: leftmost), until no pair has a merge. Merges are held as a hash table of id pairs.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;
use std::ops::Range;

use hashbrown::{DefaultHashBuilder, HashTable};

use super::pieces::Pieces;

pub struct Bpe {
    pub pieces: Pieces,
    merges: HashTable<Merge>,
    hasher: DefaultHashBuilder,
}

#[derive(Clone, Copy)]
struct Merge {
    left: u32,
    right: u32,
    rank: u32,
    into: u32,
}

impl Bpe {
    /// `merges[r]` is the pair of rank `r`, each side and their concatenation a piece. A
    /// pair given twice keeps its last rank, as the crate's map does.
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
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let m = Merge {
                left: id(a)?,
                right: id(b)?,
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
        })
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
        let mut syms: Vec<Symbol> = word
            .char_indices()
            .filter_map(|(at, c)| {
                let id = self.pieces.id(&word[at..at + c.len_utf8()])?;
                Some(Symbol {
                    id,
                    start: at,
                    len: c.len_utf8(),
                    prev: None,
                    next: None,
                })
            })
            .collect();
        let n = syms.len();
        for (i, s) in syms.iter_mut().enumerate() {
            s.prev = i.checked_sub(1);
            s.next = (i + 1 < n).then_some(i + 1);
        }
        let mut heap = BinaryHeap::new();
        for i in 1..n {
            self.push_pair(&syms, i - 1, &mut heap);
        }
        while let Some(Queued { rank: _, pos, into }) = heap.pop() {
            let Some(nx) = syms[pos].next.filter(|_| syms[pos].len > 0) else {
                continue;
            };
            // Stale: the pair at `pos` changed since it was queued.
            if self.merge(syms[pos].id, syms[nx].id).map(|m| m.into) != Some(into) {
                continue;
            }
            let right = std::mem::replace(&mut syms[nx].len, 0);
            syms[pos].id = into;
            syms[pos].len += right;
            syms[pos].next = syms[nx].next;
            if let Some(after) = syms[nx].next {
                syms[after].prev = Some(pos);
            }
            if let Some(pv) = syms[pos].prev {
                self.push_pair(&syms, pv, &mut heap);
            }
            self.push_pair(&syms, pos, &mut heap);
        }
        syms.iter()
            .filter(|s| s.len > 0)
            .map(|s| (s.id, s.start..s.start + s.len))
            .collect()
    }

    /// Queue the pair of symbol `left` and its next, if they have a merge.
    fn push_pair(&self, syms: &[Symbol], left: usize, heap: &mut BinaryHeap<Queued>) {
        let Some(right) = syms[left].next else {
            return;
        };
        if let Some(m) = self.merge(syms[left].id, syms[right].id) {
            heap.push(Queued {
                rank: m.rank,
                pos: left,
                into: m.into,
            });
        }
    }
}

struct Symbol {
    id: u32,
    start: usize,
    /// Bytes; 0 once merged into the symbol on its left.
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Queued {
    rank: u32,
    pos: usize,
    into: u32,
}

impl Ord for Queued {
    /// The heap's greatest first: lowest rank, then leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        other.rank.cmp(&self.rank).then(other.pos.cmp(&self.pos))
    }
}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Queued {}

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
    fn a_merge_outside_the_vocabulary_is_refused() {
        let p = Pieces::new(["a", "b"]).unwrap();
        assert!(Bpe::new(p, [("a", "b")]).is_err());
    }
}
