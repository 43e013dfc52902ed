//! The shared tier for several cloud nodes: prompt KV in Redis under its content address, in
//! the same verified format as the disk tier.

use crate::store::{read_prefix, write_prefix};
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

    pub fn put(&self, address: &str, kv: &PrefixKv) -> Result<()> {
        let mut bytes = Vec::new();
        write_prefix(&mut bytes, kv)?;
        redis::cmd("SET")
            .arg(self.key(address))
            .arg(bytes)
            .exec(&mut self.conn()?)
            .map_err(|e| KvError::Store(format!("redis SET: {e}")))
    }

    /// The stored prefix, verified; `None` if absent.
    pub fn get(&self, address: &str) -> Result<Option<PrefixKv>> {
        let bytes: Option<Vec<u8>> = redis::cmd("GET")
            .arg(self.key(address))
            .query(&mut self.conn()?)
            .map_err(|e| KvError::Store(format!("redis GET: {e}")))?;
        bytes.map(|b| read_prefix(&mut &b[..])).transpose()
    }
}
