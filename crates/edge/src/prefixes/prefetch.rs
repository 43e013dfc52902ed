//! Prefetching what the cloud publishes, so that no fetch depends on which system messages this
//! edge sees. Each list the edge takes is walked in the list's own order: every published prompt
//! that fits the prefetch budget (in that order) and is neither held, on disk nor arriving is
//! fetched at once, and kept in memory while it is listed (never evicted). A system message
//! that matches a published prompt then finds it held, on disk or arriving, and joins it; one
//! the budget left out (or whose prefetch failed) is computed here, never asked for on use.
//! Without it, a cloud that lists the address of a guessed private message would learn from
//! the edge's fetch whether the message is used here.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use edgeprompt_protocol::PromptRef;

use super::flight::Settling;
use super::{Prefixes, Reach};
use crate::catalog::Published;

/// How often the prefetch loop looks for a new list (the catalog asks the cloud at most every
/// `LIST_TTL`).
const LOOK: Duration = Duration::from_secs(1);

/// How long a prompt whose prefetch failed waits before the next walk tries it again.
const RETRY: Duration = Duration::from_secs(30);

/// What the prefetcher knows: the prompts it keeps, the list it walked last, and its failures.
#[derive(Default)]
pub(super) struct Prefetch {
    /// Keys of the prompts the last walk planned (within the budget): never evicted.
    pub(super) plan: HashSet<String>,
    walked: Weak<Published>,
    failed: HashMap<String, Instant>,
}

impl Prefixes {
    /// Whether published prompts are prefetched (and so never fetched on use).
    pub(super) fn prefetches(&self) -> bool {
        self.cfg.prefetch_bytes > 0 && self.cfg.cloud_url.is_some() && self.me.get().is_some()
    }

    /// Start prefetching (with a budget and a cloud): a loop in the background that walks each
    /// new list, from now until the last handle on these prefixes is gone. Needs a Tokio
    /// runtime; without one nothing starts (and published prompts are computed here).
    pub fn start_prefetch(self: &Arc<Self>) {
        if self.cfg.prefetch_bytes == 0 || self.cfg.cloud_url.is_none() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("no runtime to prefetch in: published prompts are fetched on use");
            return;
        };
        let _ = self.me.set(Arc::downgrade(self));
        let me = Arc::downgrade(self);
        rt.spawn(async move {
            loop {
                let Some(p) = me.upgrade() else { return };
                if let Ok(list) = p.catalog.refresh().await {
                    p.walk_if_new(&list);
                }
                drop(p);
                tokio::time::sleep(LOOK).await;
            }
        });
    }

    /// Walk `list` unless it was walked already: plan what fits the budget in list order and
    /// fetch what of it is not here yet, all at once (a request joins its prompt's fetch).
    pub(super) fn walk_if_new(&self, list: &Arc<Published>) {
        let Some(me) = self.me.get().and_then(Weak::upgrade) else {
            return;
        };
        let cfg = &self.model.cfg;
        // The plan under the prefetcher's lock alone (eviction takes it inside the entries'
        // lock: never the other way round).
        let due: Vec<(String, String)> = {
            let mut pf = self.prefetch.lock().unwrap_or_else(|p| p.into_inner());
            if pf.walked.upgrade().is_some_and(|w| Arc::ptr_eq(&w, list)) {
                return;
            }
            pf.walked = Arc::downgrade(list);
            let mut left = self.cfg.prefetch_bytes;
            let mut plan = HashSet::new();
            let mut due = Vec::new();
            for p in &list.prompts {
                let bytes = cfg.prompt_bytes(p.tokens);
                if bytes > left {
                    continue;
                }
                left -= bytes;
                let key = self.key(&p.address);
                plan.insert(key.clone());
                if pf.failed.get(&key).is_none_or(|at| at.elapsed() >= RETRY) {
                    due.push((key, p.address.clone()));
                }
            }
            pf.failed.retain(|k, _| plan.contains(k));
            pf.plan = plan;
            due
        };
        let to_fetch: Vec<(String, String)> = due
            .into_iter()
            .filter(|(key, _)| {
                !(self.held(key)
                    || self.flying(key)
                    || self.disk.as_ref().is_some_and(|d| d.contains(key)))
            })
            .collect();
        for (key, address) in to_fetch {
            // The flight exists before this returns: a request that comes next joins it.
            let (slot, interest, _) = me.join(&key, true);
            let settling = Settling {
                prefixes: me.clone(),
                key: key.clone(),
                slot: slot.clone(),
                done: false,
            };
            let me = me.clone();
            tokio::spawn(async move {
                let mut settling = settling;
                let prompt = PromptRef::ContentAddress(hex::decode(&address).unwrap_or_default());
                let got = me
                    .lookup(&key, prompt, None, Reach::Anywhere, Some(&slot))
                    .await;
                settling.settle(&got);
                if let Err(e) = &got {
                    tracing::info!("prefetch of a published prompt failed ({e}); retried later");
                    let mut pf = me.prefetch.lock().unwrap_or_else(|p| p.into_inner());
                    pf.failed.insert(key, Instant::now());
                }
                // Held to the end: requests that joined and left do not stop the fetch.
                drop(interest);
            });
        }
    }

    /// Whether a lookup of `key` is running.
    fn flying(&self, key: &str) -> bool {
        self.streams
            .lock()
            .is_ok_and(|m| m.get(key).is_some_and(|f| f.interest.upgrade().is_some()))
    }

    /// Whether `key` is a prompt the prefetcher keeps (never evicted while listed).
    pub(super) fn kept_for_prefetch(&self, key: &str) -> bool {
        self.prefetch.lock().is_ok_and(|pf| pf.plan.contains(key))
    }
}
