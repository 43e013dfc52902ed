//! A Redis Cluster on loopback: six `redis-server`s (three masters, a replica each) made a
//! cluster by `redis-cli --cluster create`, returned once every replica is in sync.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    pub port: u16,
}

pub struct Cluster {
    /// Each node's plain port (`port`) is what the helpers here speak to.
    pub servers: Vec<Server>,
    /// A TLS cluster: each node's TLS port (what it announces to clients), and the CA (PEM)
    /// its certificate is signed by.
    pub tls: Option<(Vec<u16>, Vec<u8>)>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// What clients are given: `redis://` URLs, or `rediss://` ones on the TLS ports.
    pub fn urls(&self) -> Vec<String> {
        match &self.tls {
            Some((ports, _)) => ports
                .iter()
                .map(|p| format!("rediss://127.0.0.1:{p}"))
                .collect(),
            None => self
                .servers
                .iter()
                .map(|s| format!("redis://127.0.0.1:{}", s.port))
                .collect(),
        }
    }

    pub fn kill(&mut self, port: u16) {
        let s = self.servers.iter_mut().find(|s| s.port == port).unwrap();
        s.child.kill().unwrap();
        s.child.wait().unwrap();
    }
}

pub fn conn(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap()
}

pub fn info(port: u16, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query(&mut conn(port))
        .unwrap_or_default()
}

/// The keys matching `pattern` on one node (a master holds its slots' keys).
pub fn keys(port: u16, pattern: &str) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(pattern)
        .query(&mut conn(port))
        .unwrap_or_default()
}

pub fn cluster_ok(port: u16) -> bool {
    redis::cmd("CLUSTER")
        .arg("INFO")
        .query::<String>(&mut conn(port))
        .is_ok_and(|s| s.contains("cluster_state:ok"))
}

/// A free port, none of `taken` nor their bus twins.
fn free_port(taken: &[u16]) -> u16 {
    loop {
        let p = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !taken.iter().any(|&t| p == t || p == t + 10000) {
            return p;
        }
    }
}

/// Six free ports whose cluster-bus twins (`port + 10000`) are free too.
fn ports() -> Vec<u16> {
    let mut got = Vec::new();
    while got.len() < 6 {
        let p = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if p < 55535 && !got.contains(&p) && free(p + 10000) {
            got.push(p);
        }
    }
    got
}

pub fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < limit, "{what}: not after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    t0.elapsed()
}

pub fn cluster() -> Cluster {
    cluster_with(false)
}

/// A cluster whose clients and nodes speak TLS to each other (each node keeps a plain port
/// on loopback for the helpers here).
pub fn tls_cluster() -> Cluster {
    cluster_with(true)
}

fn cluster_with(tls: bool) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let pki = tls.then(|| pki(dir.path()));
    let ports = ports();
    let mut tls_ports: Vec<u16> = Vec::new();
    while tls && tls_ports.len() < ports.len() {
        let p = free_port(&ports);
        if !tls_ports.contains(&p) {
            tls_ports.push(p);
        }
    }
    let servers: Vec<Server> = ports
        .iter()
        .enumerate()
        .map(|(i, &port)| {
            let mut cmd = Command::new("redis-server");
            if let Some([ca, cert, key]) = &pki {
                cmd.args(["--tls-port", &tls_ports[i].to_string()])
                    .args(["--tls-cert-file", &cert.display().to_string()])
                    .args(["--tls-key-file", &key.display().to_string()])
                    .args(["--tls-ca-cert-file", &ca.display().to_string()])
                    .args(["--tls-auth-clients", "no"])
                    .args(["--tls-cluster", "yes", "--tls-replication", "yes"]);
            }
            let child = cmd
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .args(["--dir", &dir.path().display().to_string()])
                .args(["--save", "", "--appendonly", "no"])
                // A replica's first sync without waiting for more replicas to batch with.
                .args(["--repl-diskless-sync-delay", "0"])
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server not found: apt-get install redis-server (.ci/run does)");
            Server { child, port }
        })
        .collect();
    for s in &servers {
        wait_for("redis-server up", Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", s.port)).is_ok()
        });
    }
    let nodes: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    let mut create = Command::new("redis-cli");
    if let Some([ca, ..]) = &pki {
        // Over TLS: the nodes then announce their TLS ports.
        create.args(["--tls", "--cacert", &ca.display().to_string()]);
    }
    let nodes: Vec<String> = match tls {
        true => tls_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
        false => nodes,
    };
    let out = create
        .args(["--cluster", "create"])
        .args(&nodes)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .output()
        .expect("redis-cli (redis-tools) runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let c = Cluster {
        servers,
        tls: pki.map(|[ca, ..]| (tls_ports, std::fs::read(ca).unwrap())),
        _dir: dir,
    };
    for s in &c.servers {
        wait_for("cluster_state:ok", Duration::from_secs(30), || {
            cluster_ok(s.port)
        });
    }
    // A master killed before its replica's first sync would lose its slots for good.
    for s in &c.servers {
        if info(s.port, "replication").contains("role:slave") {
            wait_for("replica in sync", Duration::from_secs(30), || {
                info(s.port, "replication").contains("master_link_status:up")
            });
        }
    }
    c
}

/// The master serving `key`'s slot (from `CLUSTER NODES`) and its replica.
pub fn holders(ports: &[u16], key: &str) -> (u16, u16) {
    let mut c = conn(ports[0]);
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut c)
        .unwrap();
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut c).unwrap();
    let port_of = |addr: &str| -> u16 { addr.split(['@', ':']).nth(1).unwrap().parse().unwrap() };
    let lines: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let master = lines
        .iter()
        .find(|f| {
            f[2].contains("master")
                && f[8..].iter().any(|r| match r.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).contains(&slot),
                    None => r.parse::<u16>() == Ok(slot),
                })
        })
        .unwrap();
    let master = port_of(master[1]);
    // Its replica, as the replica itself says (another node's view may lag).
    let replica = ports
        .iter()
        .copied()
        .find(|&p| info(p, "replication").contains(&format!("master_port:{master}\r")))
        .unwrap();
    (master, replica)
}

/// One `redis-server` on a free loopback port, and its URL.
pub fn single() -> (Server, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server not found: apt-get install redis-server (.ci/run does)");
    let server = Server { child, port };
    wait_for("redis-server up", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    (server, format!("redis://127.0.0.1:{port}/"))
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `redis-server` speaking TLS only, its `rediss://` URL and the CA (PEM) its certificate
/// (for 127.0.0.1 and localhost) is signed by.
pub struct TlsServer {
    pub server: Server,
    pub url: String,
    pub ca_pem: Vec<u8>,
    _dir: tempfile::TempDir,
}

/// A CA and a certificate for 127.0.0.1 and localhost signed by it, written to `dir`:
/// (CA file, certificate file, key file).
fn pki(dir: &std::path::Path) -> [std::path::PathBuf; 3] {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    // Names of their own: OpenSSL (redis-cli, the cluster bus) takes a leaf named as its
    // issuer for a self-signed one.
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "edgeprompt test CA");
    let ca_cert = ca.clone().self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let mut leaf =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into()]).unwrap();
    leaf.distinguished_name
        .push(rcgen::DnType::CommonName, "redis on loopback");
    let leaf = leaf.signed_by(&key, &issuer).unwrap();
    let files = ["ca.pem", "cert.pem", "key.pem"].map(|n| dir.join(n));
    for (f, pem) in files
        .iter()
        .zip([ca_cert.pem(), leaf.pem(), key.serialize_pem()])
    {
        std::fs::write(f, pem).unwrap();
    }
    files
}

pub fn single_tls() -> TlsServer {
    let dir = tempfile::tempdir().unwrap();
    let [ca, cert, key] = pki(dir.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", "0"])
        .args(["--tls-port", &port.to_string()])
        .args(["--tls-cert-file", &cert.display().to_string()])
        .args(["--tls-key-file", &key.display().to_string()])
        .args(["--tls-ca-cert-file", &ca.display().to_string()])
        .args(["--tls-auth-clients", "no"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server not found: apt-get install redis-server (.ci/run does)");
    let server = Server { child, port };
    wait_for("redis-server up", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    TlsServer {
        server,
        url: format!("rediss://127.0.0.1:{port}/"),
        ca_pem: std::fs::read(&ca).unwrap(),
        _dir: dir,
    }
}
