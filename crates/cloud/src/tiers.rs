//! Where cloud nodes share prompt KV: a hot tier in Redis (one instance or a cluster) and a
//! durable one in an object store. A node looks in them, in that order, before it prefills,
//! and stores what it prefills in both. Nothing read from them is taken unchecked: the caller
//! checks the model, the address and the seal.

use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeprompt_engine::PrefixKv;
use edgeprompt_kv::{BucketStore, Expect, RedisStore, Seal, Stored};

#[derive(Clone)]
pub struct SharedTiers {
    pub redis: Option<Arc<RedisStore>>,
    pub bucket: Option<Arc<BucketStore>>,
    /// This node's name on the leases it takes (random: only the node needs to know it).
    holder: String,
}

impl Default for SharedTiers {
    fn default() -> Self {
        let mut id = [0u8; 8];
        // A fixed name if the system has no randomness: leases then only expire.
        let _ = getrandom::fill(&mut id);
        Self {
            redis: None,
            bucket: None,
            holder: hex::encode(id),
        }
    }
}

/// How long a prefill lease holds; a node waiting on another's lease computes the prompt
/// itself past it (a holder that died, or one slower than this).
pub const LEASE: Duration = Duration::from_secs(60);
/// How often a node waiting on a lease looks for the prompt.
const LEASE_POLL: Duration = Duration::from_millis(100);

/// Where a shared prompt was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Redis,
    Bucket,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::Redis => "redis",
            Tier::Bucket => "object store",
        }
    }
}

pub type Entry = (PrefixKv, Option<Seal>);

impl SharedTiers {
    pub fn is_empty(&self) -> bool {
        self.redis.is_none() && self.bucket.is_none()
    }

    /// Each tier's entry for `address` in turn, until `accept` takes one. A tier that fails
    /// or holds something refused is passed over (logged), never an error of the request.
    pub async fn find(
        &self,
        fingerprint: &str,
        address: &str,
        expect: &Expect,
        accept: &(dyn Fn(Tier, Entry) -> Option<Arc<PrefixKv>> + Sync),
    ) -> Option<(Tier, Arc<PrefixKv>)> {
        if let Some(redis) = self.redis.clone() {
            let (key, e) = (address.to_string(), expect.clone());
            match tokio::task::spawn_blocking(move || redis.get(&key, &e)).await {
                Ok(Ok(Some(entry))) => {
                    if let Some(kv) = accept(Tier::Redis, entry) {
                        return Some((Tier::Redis, kv));
                    }
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => tracing::warn!("shared tier redis: {e}"),
                Err(e) => tracing::warn!("shared tier redis: {e}"),
            }
        }
        if let Some(bucket) = &self.bucket {
            match bucket.get(fingerprint, address, expect).await {
                Ok(Some(entry)) => {
                    if let Some(kv) = accept(Tier::Bucket, entry) {
                        return Some((Tier::Bucket, kv));
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("shared tier object store: {e}"),
            }
        }
        None
    }

    /// Before prefilling `address`: take its lease in Redis, or wait while another node holds
    /// it and take the prompt from the tiers once that node stored it. `Some` is that prompt;
    /// `None` means prefill here (the lease taken, no Redis, Redis failing, or the lease run
    /// out). So a prompt is prefilled once across the nodes sharing a Redis.
    pub async fn claim(
        &self,
        fingerprint: &str,
        address: &str,
        expect: &Expect,
        accept: &(dyn Fn(Tier, Entry) -> Option<Arc<PrefixKv>> + Sync),
    ) -> Option<(Tier, Arc<PrefixKv>)> {
        let redis = self.redis.clone()?;
        let t0 = Instant::now();
        loop {
            let (r, key, holder) = (redis.clone(), address.to_string(), self.holder.clone());
            match tokio::task::spawn_blocking(move || r.lease(&key, &holder, LEASE)).await {
                Ok(Ok(true)) => return None,
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    tracing::warn!("shared tier redis: lease of {address}: {e}; computing");
                    return None;
                }
                Err(e) => {
                    tracing::warn!("shared tier redis: lease of {address}: {e}; computing");
                    return None;
                }
            }
            // Another node is prefilling it: wait for its copy (or for its lease to go).
            while t0.elapsed() < LEASE {
                tokio::time::sleep(LEASE_POLL).await;
                if let Some(found) = self.find(fingerprint, address, expect, accept).await {
                    return Some(found);
                }
                let (r, key) = (redis.clone(), address.to_string());
                match tokio::task::spawn_blocking(move || r.leased(&key)).await {
                    Ok(Ok(true)) => {}
                    // Given back or expired without a copy stored: take it.
                    Ok(Ok(false)) => break,
                    _ => return None,
                }
            }
            if t0.elapsed() >= LEASE {
                tracing::warn!("shared tier: {address} still leased after {LEASE:?}; computing");
                return None;
            }
        }
    }

    /// Store a prompt's KV in the tiers above the one it came `from`: a prefilled prompt in
    /// both, one read from the object store in Redis (the hot tier), one read from Redis
    /// nowhere. The object is written create-only: a replica that lost the race keeps the
    /// winner's.
    pub async fn store(
        &self,
        address: &str,
        kv: Arc<PrefixKv>,
        seal: Option<Seal>,
        from: Option<Tier>,
    ) {
        if let (Some(redis), false) = (self.redis.clone(), from == Some(Tier::Redis)) {
            let (key, kv, seal) = (address.to_string(), kv.clone(), seal.clone());
            match tokio::task::spawn_blocking(move || redis.put(&key, &kv, seal.as_ref())).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!("shared tier redis: could not store {address}: {e}"),
                Err(e) => tracing::warn!("shared tier redis: could not store {address}: {e}"),
            }
        }
        if let (Some(bucket), None) = (&self.bucket, from) {
            match bucket.put(address, &kv, seal.as_ref()).await {
                Ok(Stored::Created) => {}
                Ok(Stored::Existed) => {
                    tracing::info!("object store: {address} was stored by another node first")
                }
                Err(e) => tracing::warn!("object store: could not store {address}: {e}"),
            }
        }
        // A prefill's lease (if this node took one) is done with once the copies are stored.
        if let (Some(redis), None) = (self.redis.clone(), from) {
            let (key, holder) = (address.to_string(), self.holder.clone());
            if let Ok(Err(e)) =
                tokio::task::spawn_blocking(move || redis.release(&key, &holder)).await
            {
                tracing::warn!("shared tier redis: releasing the lease of {address}: {e}");
            }
        }
    }
}
