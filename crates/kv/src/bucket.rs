//! The durable tier: each published prompt's sealed KV as one immutable object in an object
//! store (S3-compatible stores, local files), in the format of the disk and Redis tiers.
//!
//! Objects are named `<root>/<model fingerprint>/<content address>.kv` and written create-only:
//! a replica that loses a race to store a prompt drops its copy, so an object never changes once
//! written and any cache or relay in front of the store may keep it. The chunks are layer-major,
//! so one GET read in order yields the layers in order.

use std::sync::{Arc, Once};
use std::time::Duration;

use futures_util::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::http::HttpBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, ObjectStoreScheme, PutMode,
    PutOptions, PutPayload, RetryConfig,
};

use crate::seal::Seal;
use crate::store::{read_prefix, write_prefix, Expect};
use crate::{KvError, Result};
use edgeprompt_engine::PrefixKv;

/// What a create-only write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    Created,
    /// Another writer stored this prompt first; its object stands.
    Existed,
}

pub struct BucketStore {
    store: Arc<dyn ObjectStore>,
    root: Path,
    url: String,
}

impl std::fmt::Debug for BucketStore {
    // The URL only: the store's options hold its credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BucketStore({})", self.url)
    }
}

/// The TLS provider reqwest's rustls uses (ring, as tonic's): installed once per process.
pub fn install_tls() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Fails only if another provider is installed already, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A bucket read over plain HTTP(S) GETs, as from a CDN in front of it (read-only).
fn http(url: &str, parsed: &url::Url) -> Result<Arc<dyn ObjectStore>> {
    let base = &url[..parsed[..url::Position::BeforePath].len()];
    let store = HttpBuilder::new()
        .with_url(base)
        .with_client_options(client(parsed.scheme() == "http"))
        .with_retry(retry())
        .build()
        .map_err(|e| KvError::Store(format!("object store {url}: {e}")))?;
    Ok(Arc::new(store))
}

impl BucketStore {
    /// `url`: `s3://bucket/prefix` (credentials, endpoint and region from the `AWS_*`
    /// variables, e.g. `AWS_ENDPOINT=http://127.0.0.1:8333` and `AWS_ALLOW_HTTP=true` for a
    /// store without TLS), `https://host/prefix` (objects read over HTTP, e.g. through a CDN;
    /// nothing is written there) or `file:///dir`.
    pub fn open(url: &str) -> Result<Self> {
        Self::open_with(url, std::env::vars().filter(|(k, _)| k.starts_with("AWS_")))
    }

    /// As `open`, with the store's options given (`aws_endpoint`, `aws_access_key_id`, ...).
    pub fn open_with(
        url: &str,
        options: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self> {
        install_tls();
        let bad = |e: &dyn std::fmt::Display| KvError::Store(format!("object store {url}: {e}"));
        let parsed = url::Url::parse(url).map_err(|e| bad(&e))?;
        // Credentials come from the options, never the URL (which is logged, and would go in
        // the clear over http://).
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(KvError::Store(
                "object store URL with credentials in it: give them in the AWS_* variables".into(),
            ));
        }
        let (scheme, root) = ObjectStoreScheme::parse(&parsed).map_err(|e| bad(&e))?;
        let store: Arc<dyn ObjectStore> = match scheme {
            ObjectStoreScheme::AmazonS3 => {
                // The options after the client's: they may set its keys (`aws_allow_http`).
                let builder = AmazonS3Builder::new()
                    .with_url(url)
                    .with_client_options(client(false))
                    .with_retry(retry());
                let builder = options.into_iter().fold(builder, |b, (k, v)| {
                    match k.to_ascii_lowercase().parse() {
                        Ok(key) => b.with_config(key, v),
                        Err(_) => b,
                    }
                });
                Arc::new(builder.build().map_err(|e| bad(&e))?)
            }
            // A bucket read over plain HTTP(S), as from a CDN in front of it (read-only).
            ObjectStoreScheme::Http => http(url, &parsed)?,
            ObjectStoreScheme::Local => Arc::new(LocalFileSystem::new()),
            other => {
                return Err(bad(&format!(
                    "{other:?} stores are not built in (s3://, file://)"
                )))
            }
        };
        Ok(Self {
            store,
            root: Path::parse(root.as_ref()).map_err(|e| bad(&e))?,
            url: url.into(),
        })
    }

    /// The store a cloud's list names (`store_url`): plain HTTP(S) GETs only, given none of
    /// this process's credentials (no `AWS_*` variable reaches a host the cloud names), never a
    /// local file.
    pub fn open_listed(url: &str) -> Result<Self> {
        install_tls();
        let bad =
            |e: &dyn std::fmt::Display| KvError::Store(format!("listed object store {url}: {e}"));
        let parsed = url::Url::parse(url).map_err(|e| bad(&e))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(bad(&"only http:// or https:// is read"));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(bad(&"a URL with credentials in it"));
        }
        // Plain GETs whatever the host: a host that looks like S3's would otherwise get an S3
        // client, which signs with whatever credentials this machine has (its environment, a
        // cloud's instance metadata).
        Ok(Self {
            store: http(url, &parsed)?,
            root: Path::from_url_path(parsed.path()).map_err(|e| bad(&e))?,
            url: url.into(),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Where the object of `address` (a prompt of the model `fingerprint`) lives.
    pub fn path(&self, fingerprint: &str, address: &str) -> Path {
        self.root
            .clone()
            .join(fingerprint)
            .join(format!("{address}.kv"))
    }

    /// Store a prompt's KV under its address unless an object is already there.
    pub async fn put(&self, address: &str, kv: &PrefixKv, seal: Option<&Seal>) -> Result<Stored> {
        let mut bytes = Vec::new();
        write_prefix(&mut bytes, kv, seal)?;
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let path = self.path(&kv.fingerprint, address);
        match self
            .store
            .put_opts(&path, PutPayload::from(bytes), opts)
            .await
        {
            Ok(_) => Ok(Stored::Created),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Stored::Existed),
            Err(e) => Err(KvError::Store(format!("put {path}: {e}"))),
        }
    }

    /// The stored prefix and its seal, checked against `expect`; `None` if absent. Whether
    /// the seal is trusted, and whether the prefix is the one asked for, is the caller's check.
    pub async fn get(
        &self,
        fingerprint: &str,
        address: &str,
        expect: &Expect,
    ) -> Result<Option<(PrefixKv, Option<Seal>)>> {
        let path = self.path(fingerprint, address);
        let most = expect.max_stored_bytes();
        let got = match self.store.get(&path).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(KvError::Store(format!("get {path}: {e}"))),
        };
        // Bounded before anything is allocated: by what the store says, then by what it sends.
        if got.meta.size > most {
            return Err(KvError::Bound(format!(
                "object {path} of {} bytes, more than a prompt of this model can be ({most})",
                got.meta.size
            )));
        }
        // Grown as bytes arrive: a size the store merely claims reserves nothing.
        let mut bytes = Vec::new();
        let mut body = got.into_stream();
        while let Some(part) = tokio::time::timeout(READ_STALL, body.next())
            .await
            .map_err(|_| KvError::Store(format!("get {path}: no bytes for {READ_STALL:?}")))?
        {
            let part = part.map_err(|e| KvError::Store(format!("get {path}: {e}")))?;
            if bytes.len() as u64 + part.len() as u64 > most {
                return Err(KvError::Bound(format!(
                    "object {path} is longer than {most}"
                )));
            }
            bytes.extend_from_slice(&part);
        }
        read_prefix(&mut &bytes[..], expect).map(Some)
    }
}

/// Every request has a deadline, and a store that does not answer costs a request seconds, not
/// minutes of retries: the caller takes the prompt elsewhere instead.
/// `plain`: HTTP without TLS is allowed (an `http://` URL that carries no credentials); an S3
/// store sends its keys, and takes plain HTTP only when told (`aws_allow_http`).
fn client(plain: bool) -> ClientOptions {
    ClientOptions::new()
        .with_timeout(Duration::from_secs(30))
        .with_connect_timeout(Duration::from_secs(5))
        .with_allow_http(plain)
}

fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: 3,
        retry_timeout: Duration::from_secs(10),
    }
}

/// Longest wait for the next bytes of an object being read.
const READ_STALL: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{expect, prefix};

    /// The same interface over local files: create-only, read back whole, absent is `None`.
    #[test]
    fn a_listed_store_is_plain_http_given_nothing() {
        // A host that looks like S3's still gets plain GETs: no signing with this machine's
        // credentials for a store a cloud names.
        let s3_like = BucketStore::open_listed("https://kv.s3.amazonaws.com/deploy").unwrap();
        assert_eq!(s3_like.store.to_string(), "HttpStore");
        assert_eq!(s3_like.path("fp", "ab").as_ref(), "deploy/fp/ab.kv");
        for bad in [
            "s3://kv/deploy",
            "file:///etc",
            "https://user:secret@cdn.example/kv",
            "not a url",
        ] {
            assert!(BucketStore::open_listed(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_directory_is_a_store_too() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let store = BucketStore::open_with(&url, []).unwrap();
        let (a, b) = (prefix(600, 3), prefix(7, 3));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            assert!(store
                .get("fp", "x", &expect(3, 600))
                .await
                .unwrap()
                .is_none());
            assert_eq!(store.put("x", &a, None).await.unwrap(), Stored::Created);
            assert_eq!(store.put("x", &b, None).await.unwrap(), Stored::Existed);
            let (back, seal) = store
                .get("fp", "x", &expect(3, 600))
                .await
                .unwrap()
                .unwrap();
            assert!(seal.is_none());
            assert_eq!(back.layers, a.layers);
            // An object longer than any prompt of the reader's model is refused unread.
            assert!(store.get("fp", "x", &expect(3, 10)).await.is_err());
        });
        assert!(dir.path().join("fp/x.kv").is_file());
    }
}
