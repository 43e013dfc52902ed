//! Where cloud nodes share prompt KV: a hot tier in Redis (one instance or a cluster) and a
//! durable one in an object store. A node looks in them, in that order, before it prefills,
//! and stores what it prefills in both. Nothing read from them is taken unchecked: the caller
//! checks the model, the address and the seal.

use std::sync::Arc;

use edgeprompt_engine::PrefixKv;
use edgeprompt_kv::{BucketStore, Expect, RedisStore, Seal, Stored};

#[derive(Default, Clone)]
pub struct SharedTiers {
    pub redis: Option<Arc<RedisStore>>,
    pub bucket: Option<Arc<BucketStore>>,
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
        accept: impl Fn(Tier, Entry) -> Option<Arc<PrefixKv>>,
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
    }
}
