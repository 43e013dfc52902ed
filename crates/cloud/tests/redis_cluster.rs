//! Cloud replicas on a real Redis Cluster: six `redis-server`s on loopback (three masters, one
//! replica each), made a cluster by `redis-cli --cluster create`. A prompt is prefilled once
//! across racing replicas (the lease), served by the others from the cluster, and still served
//! from it after the master holding its slot is killed and its replica promoted.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeprompt_cloud::{CloudNode, PromptSpec};
use edgeprompt_engine::{Model, PrefixKv};
use edgeprompt_kv::{content_address, RedisStore, SealKey};

struct Server {
    child: Child,
    port: u16,
}

struct Cluster {
    servers: Vec<Server>,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for s in &mut self.servers {
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
    }
}

impl Cluster {
    fn urls(&self) -> Vec<String> {
        self.servers
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect()
    }

    fn kill(&mut self, port: u16) {
        let s = self.servers.iter_mut().find(|s| s.port == port).unwrap();
        s.child.kill().unwrap();
        s.child.wait().unwrap();
    }
}

fn conn(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap()
}

fn info(port: u16, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query(&mut conn(port))
        .unwrap_or_default()
}

fn cluster_ok(port: u16) -> bool {
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

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < limit, "{what}: not after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    t0.elapsed()
}

fn cluster() -> Cluster {
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
fn holders(ports: &[u16], key: &str) -> (u16, u16) {
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

fn model() -> Arc<Model> {
    let dir = std::env::var_os("EDGEPROMPT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    Arc::new(Model::load(dir.join("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap())
}

fn same(a: &PrefixKv, b: &PrefixKv) -> bool {
    a.token_ids == b.token_ids && a.layers.iter().zip(&b.layers).all(|(x, y)| x == y)
}

#[test]
fn replicas_share_prompts_through_a_cluster_that_loses_a_master() {
    let mut cluster = cluster();
    let m = model();
    let specs = [PromptSpec {
        id: "support".into(),
        system: "You are the support assistant of Acme Rail. Refunds are full up to 24 hours \
                 before departure."
            .into(),
        text: None,
    }];
    let urls = cluster.urls();
    let node = || {
        Arc::new(
            CloudNode::new(m.clone(), &specs, 64 << 20)
                .unwrap()
                .with_signing(SealKey::from_seed([3; 32]))
                .with_shared(Arc::new(RedisStore::open_cluster(&urls, "fleet").unwrap())),
        )
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let exact = rt.block_on(async {
        // Three replicas asked for the same cold prompt at once: one prefills (the lease),
        // the others wait for its copy.
        let racers: Vec<_> = (0..3).map(|_| node()).collect();
        let got = futures_util::future::join_all(racers.iter().map(|n| n.warm("support"))).await;
        let got: Vec<_> = got.into_iter().map(|k| k.unwrap()).collect();
        let prefills: usize = racers.iter().map(|n| n.prefills()).sum();
        assert_eq!(prefills, 1, "the prompt was prefilled {prefills} times");
        assert!(got.iter().all(|k| same(k, &got[0])));
        got[0].clone()
    });
    // The master holding the prompt goes; its replica (in sync with it) takes over.
    let address = content_address(&m.fingerprint, &exact.token_ids);
    let key = RedisStore::open_cluster(&urls, "fleet")
        .unwrap()
        .key(&address);
    let ports: Vec<u16> = cluster.servers.iter().map(|s| s.port).collect();
    let (master, replica) = holders(&ports, &key);
    wait_for("the value on the replica", Duration::from_secs(30), || {
        let mut c = conn(replica);
        let _: () = redis::cmd("READONLY").query(&mut c).unwrap();
        redis::cmd("EXISTS")
            .arg(&key)
            .query::<bool>(&mut c)
            .unwrap()
    });
    cluster.kill(master);
    let t0 = Instant::now();
    wait_for("the replica promoted", Duration::from_secs(60), || {
        info(replica, "replication").contains("role:master") && cluster_ok(replica)
    });
    println!(
        "failover: replica of {master} serving after {:?}",
        t0.elapsed()
    );
    // Every surviving node knows of the promotion (a client may ask any of them for slots).
    let survivors: Vec<u16> = cluster
        .servers
        .iter()
        .map(|s| s.port)
        .filter(|&p| p != master)
        .collect();
    wait_for(
        "the promotion known to every node",
        Duration::from_secs(60),
        || {
            survivors.iter().all(|&p| {
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query(&mut conn(p))
                    .unwrap_or_default();
                nodes
                    .lines()
                    .any(|l| l.contains(&format!(":{replica}@")) && l.contains("master"))
                    && cluster_ok(p)
            })
        },
    );
    println!("failover: every node agrees after {:?}", t0.elapsed());
    // A replica started now reads the prompt from the promoted node.
    let late = node();
    let got = rt.block_on(late.warm("support")).unwrap();
    assert_eq!(late.prefills(), 0, "the prompt was lost with its master");
    assert!(same(&got, &exact));
}
