//! The private prefix cache: a finished conversation's KV (cloud prompt, private messages and
//! answer) kept in this process's memory, so the conversation's next turn prefills only what
//! is new. The KV attends position by position, so a turn run on it gives the bits of the
//! same turn run from the cloud prompt alone.
//!
//! Private stays private: entries live in memory only (never the disk tier, never peers, never
//! named on a link), and each belongs to a scope (the API key, and the request's `cache_salt`):
//! a request runs only on its own scope's entries. The budget is shared, but over it the scope
//! holding the most drops first: a caller that floods the cache evicts its own conversations
//! before anyone else's (and learns at most how much others keep, never what).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use edgeprompt_engine::PrefixKv;
use sha2::{Digest, Sha256};

/// Who may read an entry: a digest of the API key (none on an open API) and `cache_salt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scope([u8; 32]);

impl Scope {
    pub fn new(key: Option<&[u8; 32]>, salt: Option<&str>) -> Self {
        let mut h = Sha256::new();
        h.update(b"edgeprompt-private-scope-v1\0");
        match key {
            Some(k) => {
                h.update([1]);
                h.update(k);
            }
            None => h.update([0]),
        }
        if let Some(s) = salt {
            h.update((s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        }
        Self(h.finalize().into())
    }
}

struct Entry {
    scope: Scope,
    kv: Arc<PrefixKv>,
    used: u64,
}

#[derive(Default)]
struct Inner {
    clock: u64,
    bytes: usize,
    entries: Vec<Entry>,
}

/// Entries within a byte budget, least recently used dropped first.
pub struct PrivateCache {
    budget: usize,
    inner: Mutex<Inner>,
}

impl PrivateCache {
    /// A cache of at most `budget` bytes of KV (0: off).
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The longest entry in `scope` that `ids` begin with, longer than `min` tokens and
    /// leaving at least one token of `ids` to run. Whole entries only: the running request
    /// shares the entry's KV (a cut would be a copy outside every budget).
    pub fn get(&self, scope: &Scope, ids: &[u32], min: usize) -> Option<Arc<PrefixKv>> {
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        let at = inner
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.scope == *scope
                    && e.kv.n_tokens() > min
                    && e.kv.n_tokens() < ids.len()
                    && ids.starts_with(&e.kv.token_ids)
            })
            .max_by_key(|(_, e)| e.kv.n_tokens())
            .map(|(i, _)| i)?;
        let e = &mut inner.entries[at];
        e.used = now;
        Some(e.kv.clone())
    }

    /// Keep `kv` for `scope`, replacing the entries it extends.
    pub fn put(&self, scope: Scope, kv: PrefixKv) {
        let bytes = kv.bytes();
        // Layers cut by a sliding window are not kept (not tested across turns).
        if bytes == 0 || bytes > self.budget || kv.layers.iter().any(|l| l.start() > 0) {
            return;
        }
        let mut inner = self.lock();
        inner.clock += 1;
        let used = inner.clock;
        let before = inner.entries.len();
        inner
            .entries
            .retain(|e| !(e.scope == scope && kv.token_ids.starts_with(&e.kv.token_ids)));
        if inner.entries.len() != before {
            inner.bytes = inner.entries.iter().map(|e| e.kv.bytes()).sum();
        }
        inner.bytes += bytes;
        inner.entries.push(Entry {
            scope,
            kv: Arc::new(kv),
            used,
        });
        while inner.bytes > self.budget {
            let Some(at) = victim(&inner.entries) else {
                break;
            };
            let gone = inner.entries.swap_remove(at);
            inner.bytes -= gone.kv.bytes();
        }
    }

    /// Bytes of KV held.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Conversations held.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_on(&self) -> bool {
        self.budget > 0
    }
}

/// The entry to drop over budget: the least recently used of the scope holding the most bytes
/// (of those, if several hold as much), so no caller's flood evicts a smaller holder.
fn victim(entries: &[Entry]) -> Option<usize> {
    let mut held: HashMap<Scope, usize> = HashMap::new();
    for e in entries {
        *held.entry(e.scope).or_default() += e.kv.bytes();
    }
    let most = held.values().copied().max()?;
    entries
        .iter()
        .enumerate()
        .filter(|(_, e)| held.get(&e.scope) == Some(&most))
        .min_by_key(|(_, e)| e.used)
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgeprompt_engine::LayerKv;

    fn kv(ids: &[u32]) -> PrefixKv {
        let mut l = LayerKv::new(1, 2);
        let rows: Vec<f32> = (0..ids.len() * 2).map(|i| i as f32).collect();
        l.append(&rows, &rows, ids.len());
        PrefixKv {
            fingerprint: "m".into(),
            token_ids: ids.to_vec(),
            layers: vec![Arc::new(l)],
        }
    }

    #[test]
    fn the_longest_whole_entry_in_the_same_scope_is_found() {
        let c = PrivateCache::new(1 << 20);
        let (a, b) = (
            Scope::new(Some(&[1; 32]), None),
            Scope::new(Some(&[2; 32]), None),
        );
        c.put(a, kv(&[1, 2, 3, 4, 5]));
        c.put(a, kv(&[1, 2, 7]));
        // A diverging turn: only a whole entry it begins with is used.
        assert_eq!(c.get(&a, &[1, 2, 7, 9, 9], 0).unwrap().token_ids, [1, 2, 7]);
        assert!(c.get(&a, &[1, 2, 3, 9, 9], 0).is_none());
        // One token must be left to run.
        assert!(c.get(&a, &[1, 2, 3, 4, 5], 0).is_none());
        let got = c.get(&a, &[1, 2, 3, 4, 5, 6], 0).unwrap();
        assert_eq!((got.n_tokens(), got.layers[0].len()), (5, 5));
        // No more than the cloud prompt it already has: not worth it.
        assert!(c.get(&a, &[1, 2, 7, 9], 3).is_none());
        // Another key, or the same key with a salt, sees nothing.
        assert!(c.get(&b, &[1, 2, 3, 4, 5, 6], 0).is_none());
        let salted = Scope::new(Some(&[1; 32]), Some("s"));
        assert!(c.get(&salted, &[1, 2, 3, 4, 5, 6], 0).is_none());
        assert_ne!(Scope::new(None, None), Scope::new(Some(&[0; 32]), None));
    }

    #[test]
    fn a_turn_replaces_the_one_it_extends_and_the_budget_holds() {
        let one = kv(&[1, 2]).bytes();
        let c = PrivateCache::new(10 * one);
        let s = Scope::new(None, None);
        c.put(s, kv(&[1, 2]));
        c.put(s, kv(&[1, 2, 3, 4]));
        assert_eq!(c.len(), 1, "the longer turn replaced the shorter");
        for i in 0..100u32 {
            c.put(s, kv(&[100 + i, 7]));
            assert!(c.bytes() <= 10 * one);
        }
        // The most recent are kept.
        assert!(c.get(&s, &[199, 7, 1], 0).is_some());
        assert!(c.get(&s, &[100, 7, 1], 0).is_none());
        // Larger than the whole budget: not kept.
        let big: Vec<u32> = (0..40).collect();
        c.put(s, kv(&big));
        let mut longer = big.clone();
        longer.push(1);
        assert!(c.get(&s, &longer, 0).is_none());
        // Layers cut by a sliding window: not kept.
        let mut cut = kv(&[5, 6, 7]);
        cut.layers[0] = Arc::new(LayerKv::clone(&cut.layers[0]).starting_at(1));
        c.put(s, cut);
        assert!(c.get(&s, &[5, 6, 7, 8], 0).is_none());
        assert!(!PrivateCache::new(0).is_on());
    }

    #[test]
    fn a_caller_flooding_the_cache_evicts_its_own_conversations_first() {
        let one = kv(&[1, 2]).bytes();
        let c = PrivateCache::new(10 * one);
        let (a, b) = (
            Scope::new(Some(&[1; 32]), None),
            Scope::new(Some(&[2; 32]), None),
        );
        // b's conversations are the least recently used of all when a floods.
        c.put(b, kv(&[1, 2]));
        c.put(b, kv(&[3, 4]));
        for i in 0..100u32 {
            c.put(a, kv(&[100 + i, 7]));
            assert!(c.bytes() <= 10 * one);
        }
        assert_eq!(c.len(), 10);
        assert!(c.get(&b, &[1, 2, 9], 0).is_some());
        assert!(c.get(&b, &[3, 4, 9], 0).is_some());
        // a keeps its most recent, within what b leaves.
        assert!(c.get(&a, &[199, 7, 1], 0).is_some());
        assert!(c.get(&a, &[192, 7, 1], 0).is_some());
        assert!(c.get(&a, &[191, 7, 1], 0).is_none());
        // b holds the most (3 of 5): its oldest goes, though a's first is older still.
        let c = PrivateCache::new(4 * one);
        c.put(a, kv(&[1, 1]));
        c.put(b, kv(&[2, 2]));
        c.put(a, kv(&[3, 3]));
        c.put(b, kv(&[4, 4]));
        c.put(b, kv(&[5, 5]));
        assert!(c.get(&b, &[2, 2, 0], 0).is_none());
        assert!(c.get(&b, &[4, 4, 0], 0).is_some());
        assert!(c.get(&a, &[1, 1, 0], 0).is_some() && c.get(&a, &[3, 3, 0], 0).is_some());
    }
}
