//! A discrete-event simulator of an EdgePrompt fleet: one cloud, many edges, Poisson load
//! (CE-LSLM Fig. 7 at any scale). Nodes are built from two servers: a FIFO server of `c`
//! cores (a cloud's prefill queue) and a continuous-batching server (an edge, or a cloud that
//! answers every request itself); their costs come from curves measured on real nodes.
//! This module holds the clock, the arrivals and the servers; each is checked against queueing
//! theory where it has an answer (M/M/1, M/M/c, M/D/1).

pub mod fit;
pub mod model;
pub mod scenario;
pub mod server;

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Pending events in time order; equal times in the order they were scheduled, so a run is a
/// function of its seed.
pub struct Clock<E> {
    now: f64,
    seq: u64,
    heap: BinaryHeap<Pending<E>>,
}

struct Pending<E> {
    at: f64,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Pending<E> {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl<E> Eq for Pending<E> {}
impl<E> PartialOrd for Pending<E> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<E> Ord for Pending<E> {
    // Reversed: the heap's top is the earliest.
    fn cmp(&self, o: &Self) -> Ordering {
        o.at.total_cmp(&self.at).then(o.seq.cmp(&self.seq))
    }
}

impl<E> Default for Clock<E> {
    fn default() -> Self {
        Self {
            now: 0.0,
            seq: 0,
            heap: BinaryHeap::new(),
        }
    }
}

impl<E> Clock<E> {
    pub fn now(&self) -> f64 {
        self.now
    }

    /// `event` `after` seconds from now.
    pub fn schedule(&mut self, after: f64, event: E) {
        self.seq += 1;
        self.heap.push(Pending {
            at: self.now + after.max(0.0),
            seq: self.seq,
            event,
        });
    }

    /// The next event; the clock moves to its time.
    pub fn advance(&mut self) -> Option<E> {
        let p = self.heap.pop()?;
        self.now = p.at;
        Some(p.event)
    }
}

/// Gaps between the arrivals of a Poisson process of `rate` per second, from a seed.
pub struct Poisson {
    rate: f64,
    rng: StdRng,
}

impl Poisson {
    pub fn new(rate: f64, seed: u64) -> Self {
        Self {
            rate,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    pub fn gap(&mut self) -> f64 {
        exponential(&mut self.rng, self.rate)
    }
}

/// An exponential draw of mean `1 / rate`.
pub fn exponential(rng: &mut impl Rng, rate: f64) -> f64 {
    // 1 - U is in (0, 1]: its log is finite.
    -(1.0 - rng.random::<f64>()).ln() / rate
}

#[cfg(test)]
mod tests;
