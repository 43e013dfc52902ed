//! What both BPE models merge on: a linked list of symbols over the text, and a queue of
//! candidate merges popped best first.

use std::cmp::Ordering;

pub struct Symbol {
    pub start: usize,
    /// Bytes; 0 once merged into the symbol on its left.
    pub len: usize,
    pub prev: Option<usize>,
    pub next: Option<usize>,
}

/// Symbols over the byte spans `(start, len)`, in order, each linked to its neighbours.
pub fn linked(spans: impl Iterator<Item = (usize, usize)>) -> Vec<Symbol> {
    let mut syms: Vec<Symbol> = spans
        .map(|(start, len)| Symbol {
            start,
            len,
            prev: None,
            next: None,
        })
        .collect();
    let n = syms.len();
    for (i, s) in syms.iter_mut().enumerate() {
        s.prev = i.checked_sub(1);
        s.next = (i + 1 < n).then_some(i + 1);
    }
    syms
}

/// The symbol after `left` (if any) merged into it.
pub fn absorb_next(syms: &mut [Symbol], left: usize) {
    let Some(right) = syms[left].next else {
        return;
    };
    syms[left].len += std::mem::replace(&mut syms[right].len, 0);
    syms[left].next = syms[right].next;
    if let Some(after) = syms[right].next {
        syms[after].prev = Some(left);
    }
}

/// A candidate merge of the symbol at `pos` with the one after it. The queue (a max-heap)
/// pops the highest `key` first, then the leftmost; `tag` is the model's own check that the
/// candidate still holds when it is popped.
pub struct Queued<K> {
    pub key: K,
    pub pos: usize,
    pub tag: usize,
}

impl<K: Ord> Ord for Queued<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key.cmp(&other.key).then(other.pos.cmp(&self.pos))
    }
}

impl<K: Ord> PartialOrd for Queued<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K: Ord> PartialEq for Queued<K> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<K: Ord> Eq for Queued<K> {}

/// `f32::total_cmp`'s order as an integer's (the same bit trick it uses).
pub fn total_key(x: f32) -> i32 {
    let b = x.to_bits() as i32;
    b ^ (((b >> 31) as u32) >> 1) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn total_key_orders_as_total_cmp() {
        let xs = [
            f32::NEG_INFINITY,
            -3.5,
            -0.0,
            0.0,
            1e-40,
            2.0,
            f32::INFINITY,
            f32::NAN,
        ];
        for a in xs {
            for b in xs {
                assert_eq!(total_key(a).cmp(&total_key(b)), a.total_cmp(&b), "{a} {b}");
            }
        }
    }

    #[test]
    fn the_best_key_pops_first_then_the_leftmost() {
        let mut heap = std::collections::BinaryHeap::new();
        for (key, pos) in [(1, 5), (3, 7), (3, 2), (2, 0)] {
            heap.push(Queued { key, pos, tag: 0 });
        }
        let order: Vec<(i32, usize)> =
            std::iter::from_fn(|| heap.pop().map(|q| (q.key, q.pos))).collect();
        assert_eq!(order, vec![(3, 2), (3, 7), (2, 0), (1, 5)]);
    }
}
