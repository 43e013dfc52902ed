//! Work split for calls that stream their weights once (decode rows).
//!
//! Each worker owns a contiguous region of the groups and takes chunks from its front, so its
//! loads form one stream per call: the prefetchers ramp once. A worker whose region is done
//! takes chunks from the back of the region with the most left, so the workers still finish
//! together. Tasks handed out from one shared counter (`guided`) interleave the workers across
//! the matrix instead: each of a worker's ~6 tasks a call started a cold stream, and on
//! Qwen 0.5B's small matrices those starts cost more than the tail they balanced. Which worker
//! computes a group never changes a bit.

use std::sync::atomic::{AtomicU64, Ordering::*};

pub(super) struct Regions {
    /// Each region's unclaimed groups, `front << 32 | back`.
    left: Vec<Slot>,
    /// Chunks are whole multiples of this many groups (the region cuts too).
    min: usize,
}

/// A region's counter on cache lines of its own: its owner claims from it several times a
/// call, and on one line with the other region's counter each claim took the line from the
/// other thread (`next` 5.2 -> 3.9 % of a SmolLM2 decode's samples; tok/s within noise).
#[repr(align(128))]
struct Slot(AtomicU64);

fn pack(front: usize, back: usize) -> u64 {
    ((front as u64) << 32) | back as u64
}

fn unpack(v: u64) -> (usize, usize) {
    ((v >> 32) as usize, (v & u32::MAX as u64) as usize)
}

impl Regions {
    /// `total` groups cut into `parts` regions of whole `min`s.
    pub(super) fn new(total: usize, parts: usize, min: usize) -> Self {
        assert!(total < u32::MAX as usize, "too many groups for one call");
        let min = min.max(1);
        let per = total.div_ceil(parts.max(1)).next_multiple_of(min);
        let left = (0..parts.max(1))
            .map(|r| {
                let a = (r * per).min(total);
                Slot(AtomicU64::new(pack(a, (a + per).min(total))))
            })
            .collect();
        Self { left, min }
    }

    /// Regions (workers).
    pub(super) fn parts(&self) -> usize {
        self.left.len()
    }

    /// The next groups `a..b` for worker `w`: a quarter of what its region has left (whole
    /// `min`s), or, once that is empty, half of what the fullest other region has left, from
    /// its back. `None` when every group is claimed.
    pub(super) fn next(&self, w: usize) -> Option<(usize, usize)> {
        if let Some(r) = self.take(w, true) {
            return Some(r);
        }
        loop {
            let fullest = (0..self.left.len())
                .map(|r| {
                    let (a, b) = unpack(self.left[r].0.load(Acquire));
                    (b.saturating_sub(a), r)
                })
                .max()?;
            if fullest.0 == 0 {
                return None;
            }
            if let Some(r) = self.take(fullest.1, false) {
                return Some(r);
            }
        }
    }

    /// Claims from region `r`'s front (its owner) or back (a helper).
    fn take(&self, r: usize, front: bool) -> Option<(usize, usize)> {
        let cell = &self.left[r].0;
        let mut cur = cell.load(Acquire);
        loop {
            let (a, b) = unpack(cur);
            if a >= b {
                return None;
            }
            let share = if front { (b - a) / 4 } else { (b - a) / 2 };
            let n = share.next_multiple_of(self.min).max(self.min).min(b - a);
            let (new, got) = if front {
                (pack(a + n, b), (a, a + n))
            } else {
                (pack(a, b - n), (b - n, b))
            };
            match cell.compare_exchange_weak(cur, new, AcqRel, Acquire) {
                Ok(_) => return Some(got),
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every group is handed out exactly once, however the workers interleave.
    #[test]
    fn every_group_once() {
        for (total, parts, min) in [(0, 2, 4), (3, 2, 4), (37, 2, 4), (144, 2, 4), (1000, 3, 1)] {
            let regions = Regions::new(total, parts, min);
            let mut seen = vec![0u8; total];
            let mut w = 0;
            // Worker 1 runs alone first: it finishes its region, then empties the others.
            while let Some((a, b)) = regions.next(1 % regions.parts()) {
                assert!(a < b && b <= total);
                seen[a..b].iter_mut().for_each(|s| *s += 1);
                w += 1;
            }
            assert!(seen.iter().all(|&s| s == 1), "{total} {parts} {min}");
            assert!(w <= total.max(1));
        }
    }

    #[test]
    fn workers_meet_over_threads() {
        let regions = Regions::new(5000, 2, 4);
        let seen: Vec<AtomicU64> = (0..5000).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|s| {
            for w in 0..2 {
                let (regions, seen) = (&regions, &seen);
                s.spawn(move || {
                    while let Some((a, b)) = regions.next(w) {
                        for x in &seen[a..b] {
                            x.fetch_add(1, Relaxed);
                        }
                    }
                });
            }
        });
        assert!(seen.iter().all(|x| x.load(Relaxed) == 1));
    }
}
