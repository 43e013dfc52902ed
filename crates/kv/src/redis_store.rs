//! The shared tier for several cloud nodes: prompt KV in Redis under its content address, in
//! the same verified format as the disk tier.

use crate::seal::Seal;
use crate::store::{read_prefix, write_prefix, Expect};
use crate::{KvError, Result};
use edgeprompt_engine::PrefixKv;

pub struct RedisStore {
    client: redis::Client,
    /// Key prefix, so several deployments can share one Redis.
    namespace: String,
}

impl RedisStore {
    /// `url` like `redis://127.0.0.1:6379/`. Connections are opened per call (the calls are
    /// rare: once per prompt per node).
    pub fn open(url: &str, namespace: &str) -> Result<Self> {
        let client =
            redis::Client::open(url).map_err(|e| KvError::Store(format!("redis {url}: {e}")))?;
        Ok(Self {
            client,
            namespace: namespace.into(),
        })
    }

    fn key(&self, address: &str) -> String {
        format!("{}:kv:{address}", self.namespace)
    }

    fn conn(&self) -> Result<redis::Connection> {
        self.client
            .get_connection()
            .map_err(|e| KvError::Store(format!("redis: {e}")))
    }

    pub fn put(&self, address: &str, kv: &PrefixKv, seal: Option<&Seal>) -> Result<()> {
        let mut bytes = Vec::new();
        write_prefix(&mut bytes, kv, seal)?;
        redis::cmd("SET")
            .arg(self.key(address))
            .arg(bytes)
            .exec(&mut self.conn()?)
            .map_err(|e| KvError::Store(format!("redis SET: {e}")))
    }

    /// The stored prefix and its seal, checked against `expect`; `None` if absent. Whether the
    /// seal is trusted is the caller's check.
    pub fn get(&self, address: &str, expect: &Expect) -> Result<Option<(PrefixKv, Option<Seal>)>> {
        // Read at most what a valid value of this shape can be, whatever is stored.
        let most = expect.max_tokens as u64
            * expect.n_layers as u64
            * crate::Codec::F16.row_bytes(expect.head_dim) as u64
            * expect.n_kv_head as u64
            * 2
            + (expect.max_tokens as u64 + expect.n_layers as u64) * 64
            + (1 << 20);
        let bytes: Option<Vec<u8>> = redis::cmd("GETRANGE")
            .arg(self.key(address))
            .arg(0)
            .arg(most)
            .query(&mut self.conn()?)
            .map_err(|e| KvError::Store(format!("redis GET: {e}")))?;
        match bytes {
            // GETRANGE answers "" for a missing key.
            None => Ok(None),
            Some(b) if b.is_empty() => Ok(None),
            Some(b) if b.len() as u64 > most => Err(KvError::Store(format!(
                "redis value over {most} bytes, more than a prompt of this model can be"
            ))),
            Some(b) => read_prefix(&mut &b[..], expect).map(Some),
        }
    }
}
