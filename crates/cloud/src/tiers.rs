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
    /// This node's name on the leases it takes (random: only the node needs to know it);
    /// none if the system gave no randomness: the node then takes no lease.
    holder: Option<String>,
}

impl Default for SharedTiers {
    fn default() -> Self {
        let mut id = [0u8; 8];
        Self {
            redis: None,
            bucket: None,
            holder: getrandom::fill(&mut id).ok().map(|()| hex::encode(id)),
        }
    }
}

/// How long a prefill lease holds: under the edges' 30 s wait for a layer, since a node
/// waiting on another's lease has sent its header and nothing else. A node waiting on a lease
/// computes the prompt itself past it (a holder that died, or one slower than this).
pub const LEASE: Duration = Duration::from_secs(20);
/// How often a node waiting on a lease asks whether it is still held.
const LEASE_POLL: Duration = Duration::from_millis(100);
/// Longest wait for one Redis call as a whole (the client's socket deadlines bound each read,
/// not a value sent slowly).
const REDIS_CALL: Duration = Duration::from_secs(10);

/// `f` on a blocking thread, within `REDIS_CALL`; any failure is logged and is `None`.
async fn redis_call<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> edgeprompt_kv::Result<T> + Send + 'static,
) -> Option<T> {
    match tokio::time::timeout(REDIS_CALL, tokio::task::spawn_blocking(f)).await {
        Ok(Ok(Ok(v))) => Some(v),
        Ok(Ok(Err(e))) => {
            tracing::warn!("shared tier redis: {what}: {e}");
            None
        }
        Ok(Err(e)) => {
            tracing::warn!("shared tier redis: {what}: {e}");
            None
        }
        Err(_) => {
            tracing::warn!("shared tier redis: {what}: no answer within {REDIS_CALL:?}");
            None
        }
    }
}

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
            let got = redis_call("read", move || redis.get(&key, &e))
                .await
                .flatten();
            if let Some(kv) = got.and_then(|entry| accept(Tier::Redis, entry)) {
                return Some((Tier::Redis, kv));
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

    /// Before prefilling `address` (found in no tier): take its lease in Redis, or wait while
    /// another node holds it and take the prompt from the tiers once that node gave the lease
    /// back. `Some` is that prompt; `None` means prefill here (the lease taken, no Redis, Redis
    /// failing, or the lease run out). So a prompt is prefilled once across the nodes sharing
    /// a Redis.
    pub async fn claim(
        &self,
        fingerprint: &str,
        address: &str,
        expect: &Expect,
        accept: &(dyn Fn(Tier, Entry) -> Option<Arc<PrefixKv>> + Sync),
    ) -> Option<(Tier, Arc<PrefixKv>)> {
        let (redis, holder) = (self.redis.clone()?, self.holder.clone()?);
        let t0 = Instant::now();
        while t0.elapsed() < LEASE {
            let (r, key, h) = (redis.clone(), address.to_string(), holder.clone());
            let taken = redis_call("lease", move || r.lease(&key, &h, LEASE)).await?;
            if taken {
                // A holder may have stored it and gone between the last look and the lease.
                let found = self.find(fingerprint, address, expect, accept).await;
                if found.is_some() {
                    self.release(address).await;
                }
                return found;
            }
            // Another node is prefilling it: wait for its lease to go (it stores first), then
            // look once; a lease gone without a copy is taken here.
            loop {
                tokio::time::sleep(LEASE_POLL).await;
                let (r, key) = (redis.clone(), address.to_string());
                if !redis_call("lease", move || r.leased(&key)).await? {
                    break;
                }
                if t0.elapsed() >= LEASE {
                    break;
                }
            }
            if let Some(found) = self.find(fingerprint, address, expect, accept).await {
                return Some(found);
            }
        }
        tracing::warn!("shared tier: {address} still leased after {LEASE:?}; computing");
        None
    }

    /// Give back the lease of `address` if this node holds it (a compare-and-delete: past
    /// its time another node may hold it).
    pub async fn release(&self, address: &str) {
        if let (Some(redis), Some(holder)) = (self.redis.clone(), self.holder.clone()) {
            let key = address.to_string();
            redis_call("release", move || redis.release(&key, &holder)).await;
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
            redis_call("store", move || redis.put(&key, &kv, seal.as_ref())).await;
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
        if from.is_none() {
            self.release(address).await;
        }
    }
}
