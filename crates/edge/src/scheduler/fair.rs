//! Fair shares of the batch between clients (by their connection's address).

use super::batcher::Batcher;
use super::running::Running;

impl Batcher {
    /// Fill the batch's free slots fairly between clients: each slot to the waiting request
    /// of the client holding the fewest (queue order among equals, so one client alone is
    /// served first come, first served). When the batch is full and a client that holds no
    /// slot waits, one answer being decoded for the client holding the most (two at least)
    /// steps back to the queue for it, its KV kept: it resumes where it stopped, with the
    /// same bits, since a sequence's tokens do not depend on its batch. So no client's
    /// requests, however many or however long, hold the batch against another's.
    pub(super) fn fill(&mut self) {
        let held = |active: &[Running], c: Option<std::net::IpAddr>| {
            active.iter().filter(|r| r.client == c).count()
        };
        if self.active.len() >= self.cfg.max_batch
            && self
                .waiting
                .iter()
                .any(|w| held(&self.active, w.client) == 0)
        {
            let most = self
                .active
                .iter()
                .map(|r| (held(&self.active, r.client), r.client))
                .max_by_key(|(n, _)| *n);
            if let Some((n, c)) = most.filter(|(n, _)| *n >= 2) {
                let _ = n;
                let decoding = self.active.iter().rposition(|r| {
                    r.client == c
                        && r.cold.is_none()
                        && r.forks.is_empty()
                        && r.fed >= r.job.prompt.len()
                        && r.next.is_some()
                });
                if let Some(i) = decoding {
                    let r = self.active.remove(i);
                    self.waiting.push_back(r);
                }
            }
        }
        while self.active.len() < self.cfg.max_batch && !self.waiting.is_empty() {
            let pick = (0..self.waiting.len())
                .min_by_key(|&i| (held(&self.active, self.waiting[i].client), i))
                .unwrap_or(0);
            match self.waiting.remove(pick) {
                Some(r) => self.active.push(r),
                None => break,
            }
        }
    }
}
