//! A Redis Cluster on loopback: six `redis-server`s (three masters, a replica each) made a
//! cluster by `redis-cli --cluster create`, returned once every replica is in sync.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    pub port: u16,
}

pub struct Cluster {
    pub servers: Vec<Server>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    pub fn urls(&self) -> Vec<String> {
        self.servers
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect()
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
    let dir = tempfile::tempdir().unwrap();
    let servers: Vec<Server> = ports()
        .into_iter()
        .map(|port| {
            let child = Command::new("redis-server")
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
    let out = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&nodes)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .output()
        .expect("redis-cli (redis-tools) runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let c = Cluster { servers, _dir: dir };
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
