//! The private prefix cache: a finished conversation's KV (its private messages and answer,
//! after the cloud prompt's KV, which is held, not copied) kept in this process's memory, so the
//! conversation's next turn prefills only what is new. The KV attends position by position, so
//! a turn run on it gives the bits of the same turn run from the cloud prompt alone.
//!
//! The budget counts what the cache keeps alive: each entry's own positions, and each cloud
//! prompt they follow once, however many conversations share it.
//!
//! Private stays private: entries live in memory only (never the disk tier, never peers, never
//! named on a link), and each belongs to a scope (the API key, and the request's `cache_salt`):
//! a request runs only on its own scope's entries. The budget is shared, but over it the scope
//! holding the most drops first: a caller that floods the cache evicts its own conversations
//! before anyone else's (and learns at most how much others keep, never what).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use edgeprompt_engine::ContinuedKv;
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

    /// The edge's own scope (its one-shot and library use), apart from every caller's.
    pub fn own() -> Self {
        let mut h = Sha256::new();
        h.update(b"edgeprompt-private-scope-v1\0own");
        Self(h.finalize().into())
    }

    /// A short name of the scope for keys in memory (never shown or sent).
    pub fn tag(&self) -> String {
        hex::encode(&self.0[..16])
    }
}

/// What a request runs on from the cache: the first `len` of `kv`'s own positions (after its
/// prefix, which the request then runs on too).
#[derive(Clone, Debug)]
pub struct Hit {
    pub kv: Arc<ContinuedKv>,
    pub len: usize,
}

impl Hit {
    /// Positions the request does not compute: the prefix's and the kept ones it shares.
    pub fn n_tokens(&self) -> usize {
        self.kv.prefix_len() + self.len
    }
}

struct Entry {
    scope: Scope,
    kv: Arc<ContinuedKv>,
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

    /// The entry in `scope` that shares the most positions with `ids` (its prefix whole, then
    /// its own tokens up to where `ids` part from them), more than `min` in all and leaving at
    /// least one token of `ids` to run. A conversation whose earlier answer re-tokenizes
    /// differently still runs on the positions before the difference; they are borrowed, not
    /// copied.
    pub fn get(&self, scope: &Scope, ids: &[u32], min: usize) -> Option<Hit> {
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        let (at, len) = inner
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.scope == *scope)
            .filter_map(|(i, e)| {
                let p = e.kv.prefix_len();
                let len = e.kv.shared_with(ids)?.min(ids.len().checked_sub(p + 1)?);
                // A hybrid model's states exist only where the conversation ends.
                let whole = !e.kv.has_state() || len == e.kv.token_ids.len();
                (len > 0 && p + len > min && whole).then_some((i, len))
            })
            .max_by_key(|&(i, len)| {
                (
                    inner.entries[i].kv.prefix_len() + len,
                    inner.entries[i].used,
                )
            })?;
        let e = &mut inner.entries[at];
        e.used = now;
        Some(Hit {
            kv: e.kv.clone(),
            len,
        })
    }

    /// Keep `kv` for `scope`, replacing the entries it extends.
    pub fn put(&self, scope: Scope, kv: ContinuedKv) {
        let whole = kv.bytes() + kv.prefix.as_ref().map_or(0, |p| p.bytes());
        // After a prefix cut by a sliding window, not kept (not tested across turns).
        let cut = kv
            .prefix
            .as_ref()
            .is_some_and(|p| p.layers.iter().any(|l| l.start() > 0));
        if kv.bytes() == 0 || whole > self.budget || cut {
            return;
        }
        let mut all = kv
            .prefix
            .as_ref()
            .map_or_else(Vec::new, |p| p.token_ids.clone());
        all.extend_from_slice(&kv.token_ids);
        let mut inner = self.lock();
        inner.clock += 1;
        let used = inner.clock;
        inner
            .entries
            .retain(|e| !(e.scope == scope && e.kv.begins(&all)));
        inner.entries.push(Entry {
            scope,
            kv: Arc::new(kv),
            used,
        });
        inner.bytes = held(&inner.entries);
        while inner.bytes > self.budget {
            let Some(at) = victim(&inner.entries) else {
                break;
            };
            inner.entries.swap_remove(at);
            inner.bytes = held(&inner.entries);
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

/// Bytes the entries keep alive: their own, and each prefix they follow once.
fn held(entries: &[Entry]) -> usize {
    let mut seen = HashSet::new();
    entries
        .iter()
        .map(|e| {
            let prefix = e.kv.prefix.as_ref().filter(|p| seen.insert(Arc::as_ptr(p)));
            e.kv.bytes() + prefix.map_or(0, |p| p.bytes())
        })
        .sum()
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
    use edgeprompt_engine::{LayerKv, PrefixKv};

    fn layer(n: usize, start: usize) -> Arc<LayerKv> {
        let mut l = LayerKv::new(1, 2);
        let rows: Vec<f32> = (0..n * 2).map(|i| i as f32).collect();
        l.append(&rows, &rows, n);
        Arc::new(l.starting_at(start))
    }

    fn kv(ids: &[u32]) -> ContinuedKv {
        ContinuedKv {
            fingerprint: "m".into(),
            prefix: None,
            token_ids: ids.to_vec(),
            layers: vec![layer(ids.len(), 0)],
        }
    }

    /// `ids` after the shared `prefix`.
    fn after(prefix: &Arc<PrefixKv>, ids: &[u32]) -> ContinuedKv {
        ContinuedKv {
            fingerprint: "m".into(),
            prefix: Some(prefix.clone()),
            token_ids: ids.to_vec(),
            layers: vec![layer(ids.len(), prefix.n_tokens())],
        }
    }

    fn prefix(ids: &[u32]) -> Arc<PrefixKv> {
        Arc::new(PrefixKv {
            fingerprint: "m".into(),
            token_ids: ids.to_vec(),
            layers: vec![layer(ids.len(), 0)],
        })
    }

    #[test]
    fn a_hybrid_models_conversation_is_continued_only_whole() {
        use edgeprompt_engine::recurrent::{DeltaNet, Recurrence, Recurrent};
        let shape = Recurrence::DeltaNet(DeltaNet {
            conv_kernel: 2,
            k_heads: 1,
            v_heads: 1,
            head_dim: 2,
        });
        let state = Arc::new(Recurrent::zero(&shape));
        let p = prefix(&[1; 10]);
        let kept = ContinuedKv {
            fingerprint: "m".into(),
            prefix: Some(p.clone()),
            token_ids: vec![5, 6, 7],
            layers: vec![Arc::new(LayerKv::recurrent(1, 2, 13, state))],
        };
        let c = PrivateCache::new(1 << 20);
        let s = Scope::new(None, None);
        c.put(s, kept);
        let mut ids = vec![1; 10];
        // The whole conversation and more: continued from its end.
        ids.extend([5, 6, 7, 8]);
        assert_eq!(c.get(&s, &ids, 10).unwrap().len, 3);
        // Parting inside it (a re-tokenized answer): its state there is gone, so no hit.
        ids.truncate(10);
        ids.extend([5, 6, 9, 8]);
        assert!(c.get(&s, &ids, 10).is_none());
    }

    #[test]
    fn conversations_on_one_prefix_hold_it_once() {
        let (p, q) = (prefix(&[1; 100]), prefix(&[2; 100]));
        let c = PrivateCache::new(1 << 20);
        let s = Scope::new(None, None);
        c.put(s, after(&p, &[5, 6]));
        let one = c.bytes();
        assert_eq!(one, p.bytes() + after(&p, &[5, 6]).bytes());
        c.put(s, after(&p, &[7, 8]));
        assert_eq!(
            c.bytes(),
            one + after(&p, &[7, 8]).bytes(),
            "the prefix again"
        );
        c.put(s, after(&q, &[5, 6]));
        assert_eq!(c.bytes(), 2 * one + after(&p, &[7, 8]).bytes());
        // Found by every id: the prefix's, then its own.
        let mut ids = vec![1; 100];
        ids.extend([7, 8, 9]);
        assert_eq!(c.get(&s, &ids, 100).unwrap().kv.token_ids, [7, 8]);
        ids[0] = 2;
        assert!(c.get(&s, &ids, 100).is_none());
        // A turn that extends one replaces it; the last entry on a prefix frees it.
        let mut ids = vec![2; 100];
        ids.extend([5, 6, 1]);
        c.put(s, after(&q, &[5, 6, 1, 2]));
        assert_eq!(c.len(), 3);
        assert_eq!(
            c.get(&s, &[ids.clone(), vec![2, 3]].concat(), 100)
                .unwrap()
                .kv
                .token_ids
                .len(),
            4
        );
        let tight = PrivateCache::new(one);
        tight.put(s, after(&p, &[5, 6]));
        tight.put(s, after(&q, &[5, 6]));
        assert_eq!((tight.len(), tight.bytes()), (1, one));
        // More than the budget with its prefix: not kept.
        let small = PrivateCache::new(one - 1);
        small.put(s, after(&p, &[5, 6]));
        assert!(small.is_empty());
    }

    #[test]
    fn the_entry_sharing_the_most_in_the_same_scope_is_found() {
        let c = PrivateCache::new(1 << 20);
        let (a, b) = (
            Scope::new(Some(&[1; 32]), None),
            Scope::new(Some(&[2; 32]), None),
        );
        c.put(a, kv(&[1, 2, 3, 4, 5]));
        c.put(a, kv(&[1, 2, 7]));
        let got = |ids: &[u32]| c.get(&a, ids, 0).map(|h| (h.kv.token_ids.clone(), h.len));
        assert_eq!(got(&[1, 2, 7, 9, 9]), Some((vec![1, 2, 7], 3)));
        // A diverging turn runs on the positions before it parts from an entry.
        assert_eq!(got(&[1, 2, 3, 9, 9]), Some((vec![1, 2, 3, 4, 5], 3)));
        // One token must be left to run.
        assert_eq!(got(&[1, 2, 3, 4, 5]), Some((vec![1, 2, 3, 4, 5], 4)));
        let whole = c.get(&a, &[1, 2, 3, 4, 5, 6], 0).unwrap();
        assert_eq!(
            (whole.n_tokens(), whole.len, whole.kv.layers[0].len()),
            (5, 5, 5)
        );
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
        // After a prefix cut by a sliding window: not kept.
        let cut = Arc::new(PrefixKv {
            fingerprint: "m".into(),
            token_ids: vec![5, 6, 7],
            layers: vec![layer(2, 1)],
        });
        c.put(s, after(&cut, &[8]));
        assert!(c.get(&s, &[5, 6, 7, 8, 9], 0).is_none());
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
