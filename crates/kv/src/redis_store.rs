//! The hot tier for several cloud nodes: prompt KV in Redis (one instance or a Redis Cluster)
//! under its content address, in the same verified format as the disk tier, and the leases
//! that make a prompt prefilled once across the nodes.
//!
//! Keys carry the address as their hash tag (`<ns>:kv:{<address>}`, `<ns>:lease:{<address>}`),
//! so a prompt's value and lease live on one cluster slot.

use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::ConnectionLike;

use crate::seal::Seal;
use crate::store::{read_prefix, write_prefix, Expect};
use crate::{KvError, Result};
use edgeprompt_engine::PrefixKv;

enum Client {
    Single(redis::Client),
    Cluster(ClusterClient),
}

pub struct RedisStore {
    client: Client,
    /// Key prefix, so several deployments can share one Redis.
    namespace: String,
}

/// Longest wait for one Redis answer: past it the call fails and the caller computes.
const DEADLINE: Duration = Duration::from_secs(5);

fn err(what: &str) -> impl Fn(redis::RedisError) -> KvError + '_ {
    move |e| KvError::Store(format!("redis {what}: {e}"))
}

/// The CA a `rediss://` server's certificate must chain to (PEM; none: the system's roots).
fn certs(ca_pem: Option<&[u8]>) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: ca_pem.map(<[u8]>::to_vec),
    }
}

impl RedisStore {
    /// `url` like `redis://127.0.0.1:6379/` (`rediss://` for TLS, the server's certificate
    /// checked against the system's roots). Connections are opened per call (the calls are
    /// rare: once per prompt per node).
    pub fn open(url: &str, namespace: &str) -> Result<Self> {
        Self::open_with(url, namespace, None)
    }

    /// `open`, a `rediss://` server's certificate checked against `ca_pem` (PEM) instead.
    pub fn open_with(url: &str, namespace: &str, ca_pem: Option<&[u8]>) -> Result<Self> {
        crate::bucket::install_tls();
        let client = match ca_pem {
            None => redis::Client::open(url),
            Some(_) => redis::Client::build_with_tls(url, certs(ca_pem)),
        }
        .map_err(err(url))?;
        Ok(Self {
            client: Client::Single(client),
            namespace: namespace.into(),
        })
    }

    /// A Redis Cluster, found from any of its `nodes` (`redis://host:port`, `rediss://` for
    /// TLS); the client follows the slots as they move and reads from the master that holds
    /// them.
    pub fn open_cluster(nodes: &[String], namespace: &str) -> Result<Self> {
        Self::open_cluster_with(nodes, namespace, None)
    }

    /// `open_cluster`, TLS servers' certificates checked against `ca_pem` (PEM).
    pub fn open_cluster_with(
        nodes: &[String],
        namespace: &str,
        ca_pem: Option<&[u8]>,
    ) -> Result<Self> {
        crate::bucket::install_tls();
        // A CA means TLS to every node: a plain URL among them would fail on every call.
        if let Some(plain) = nodes
            .iter()
            .find(|n| ca_pem.is_some() && !n.starts_with("rediss://"))
        {
            return Err(KvError::Store(format!(
                "redis cluster: a CA is given but {plain} is not a rediss:// URL"
            )));
        }
        let mut builder = ClusterClient::builder(nodes.iter().map(String::as_str))
            .connection_timeout(DEADLINE)
            .response_timeout(DEADLINE)
            .retries(3);
        if ca_pem.is_some() {
            builder = builder.certs(certs(ca_pem));
        }
        let client = builder.build().map_err(err("cluster"))?;
        Ok(Self {
            client: Client::Cluster(client),
            namespace: namespace.into(),
        })
    }

    /// The key a prompt's KV is stored under.
    pub fn key(&self, address: &str) -> String {
        format!("{}:kv:{{{address}}}", self.namespace)
    }

    /// The key of the lease to prefill `address`.
    pub fn lease_key(&self, address: &str) -> String {
        format!("{}:lease:{{{address}}}", self.namespace)
    }

    fn conn(&self) -> Result<Box<dyn ConnectionLike>> {
        Ok(match &self.client {
            Client::Single(c) => {
                let conn = c
                    .get_connection_with_timeout(DEADLINE)
                    .map_err(err("connect"))?;
                conn.set_read_timeout(Some(DEADLINE))
                    .map_err(err("connect"))?;
                conn.set_write_timeout(Some(DEADLINE))
                    .map_err(err("connect"))?;
                Box::new(conn)
            }
            Client::Cluster(c) => Box::new(c.get_connection().map_err(err("cluster"))?),
        })
    }

    pub fn put(&self, address: &str, kv: &PrefixKv, seal: Option<&Seal>) -> Result<()> {
        let mut bytes = Vec::new();
        write_prefix(&mut bytes, kv, seal)?;
        redis::cmd("SET")
            .arg(self.key(address))
            .arg(bytes)
            .exec(&mut *self.conn()?)
            .map_err(err("SET"))
    }

    /// The stored prefix and its seal, checked against `expect`; `None` if absent. Whether the
    /// seal is trusted is the caller's check.
    pub fn get(&self, address: &str, expect: &Expect) -> Result<Option<(PrefixKv, Option<Seal>)>> {
        // Read at most what a valid value of this shape can be, whatever is stored.
        let most = expect.max_stored_bytes();
        let bytes: Option<Vec<u8>> = redis::cmd("GETRANGE")
            .arg(self.key(address))
            .arg(0)
            .arg(most)
            .query(&mut *self.conn()?)
            .map_err(err("GET"))?;
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

    /// Take the lease to prefill `address` for `ttl` unless another node holds it: `true` if
    /// this `holder` has it now.
    pub fn lease(&self, address: &str, holder: &str, ttl: Duration) -> Result<bool> {
        let set: Option<String> = redis::cmd("SET")
            .arg(self.lease_key(address))
            .arg(holder)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query(&mut *self.conn()?)
            .map_err(err("SET NX"))?;
        Ok(set.is_some())
    }

    /// Whether any node holds the lease of `address`.
    pub fn leased(&self, address: &str) -> Result<bool> {
        redis::cmd("EXISTS")
            .arg(self.lease_key(address))
            .query::<bool>(&mut *self.conn()?)
            .map_err(err("EXISTS"))
    }

    /// Give the lease back if `holder` still has it (past its time another node may): one
    /// compare-and-delete on the server.
    pub fn release(&self, address: &str, holder: &str) -> Result<()> {
        const RELEASE: &str =
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
        redis::cmd("EVAL")
            .arg(RELEASE)
            .arg(1)
            .arg(self.lease_key(address))
            .arg(holder)
            .exec(&mut *self.conn()?)
            .map_err(err("EVAL"))
    }
}
