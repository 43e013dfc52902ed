//! Two cloud nodes on one real Redis (a `redis-server` started for the test on loopback): a
//! prompt prefilled by one is served by the other without prefilling it again, bit for bit.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use edgeprompt_cloud::{CloudNode, PromptSpec};
use edgeprompt_engine::Model;
use edgeprompt_kv::RedisStore;

struct Redis(Child);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A throwaway redis-server on a free loopback port (CI installs it from Debian's packages).
fn redis() -> (Redis, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let redis = Redis(
        Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect(
                "redis-server not found: install it (apt-get install redis-server; .ci/run does)",
            ),
    );
    let url = format!("redis://127.0.0.1:{port}/");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (redis, url);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("redis-server did not start");
}

fn model() -> Arc<Model> {
    let dir = std::env::var_os("EDGEPROMPT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    Arc::new(Model::load(dir.join("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap())
}

#[test]
fn a_prompt_prefilled_by_one_cloud_node_is_served_by_another() {
    let (_redis, url) = redis();
    let m = model();
    let specs = [PromptSpec {
        id: "support".into(),
        system: "You are the support assistant of Acme Rail. Refunds are full up to 24 hours \
                 before departure."
            .into(),
        text: None,
    }];
    let node = |ns: &str| {
        let store = Arc::new(RedisStore::open(&url, ns).unwrap());
        Arc::new(
            CloudNode::new(m.clone(), &specs, 64 << 20)
                .unwrap()
                .with_shared(store),
        )
    };
    let (a, b, other) = (node("edgeprompt"), node("edgeprompt"), node("elsewhere"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let from_a = a.warm("support").await.unwrap();
        assert_eq!(a.prefills(), 1);
        let from_b = b.warm("support").await.unwrap();
        assert_eq!(
            b.prefills(),
            0,
            "node b prefilled a prompt node a had stored"
        );
        assert_eq!(from_a.token_ids, from_b.token_ids);
        assert!(from_a
            .layers
            .iter()
            .zip(&from_b.layers)
            .all(|(x, y)| x == y));
        // Another namespace shares nothing.
        other.warm("support").await.unwrap();
        assert_eq!(other.prefills(), 1);
    });
}
