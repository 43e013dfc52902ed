//! The KV budget's books: what admitted requests hold, and each one's share, given back when
//! it ends however it ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// What admitted requests hold: KV bytes reserved and how many they are.
#[derive(Default)]
pub(super) struct Held {
    pub(super) bytes: AtomicUsize,
    pub(super) requests: AtomicUsize,
}

/// A request's share of the KV budget and its place in the admitted count, given back when
/// the request ends however it ends.
pub(super) struct Reservation {
    pub(super) held: Arc<Held>,
    pub(super) bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.held.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        self.held.requests.fetch_sub(1, Ordering::AcqRel);
    }
}
