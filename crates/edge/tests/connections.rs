//! Slow clients cannot hold the edge's HTTP server: half-sent headers and idle kept-alive
//! connections are closed at the header deadline, a half-sent body gets 408 at the body
//! deadline, and one address holds at most its share of connections (one more is closed
//! without an answer; a closed one frees its place). Waits are bounded generously; no speed
//! is asserted.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeprompt_edge::http::access::ApiKeys;
use edgeprompt_edge::http::conn::ConnLimits;
use edgeprompt_edge::http::{serve_with, EdgeServer, ServerConfig};
use edgeprompt_edge::scheduler::SchedulerConfig;
use edgeprompt_engine::Model;

use crate::common::{self, model};

async fn edge(m: &Arc<Model>, limits: ConnLimits) -> SocketAddr {
    let state = EdgeServer::start(
        m.clone(),
        ServerConfig {
            model_id: "smollm2".into(),
            default_max_tokens: 4,
            api_keys: ApiKeys::default(),
        },
        SchedulerConfig::default(),
        edgeprompt_edge::prefixes::PrefixConfig::default(),
    )
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve_with(l, state, limits, std::future::pending()));
    addr
}

/// Everything the server sends until it closes the connection (bounded by `within`).
fn until_closed(s: &mut TcpStream, within: Duration) -> String {
    s.set_read_timeout(Some(within)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return String::from_utf8_lossy(&out).into_owned(),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return String::from_utf8_lossy(&out).into_owned()
            }
            Err(e) => panic!(
                "still open after {within:?} ({e}): {:?}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
}

const GET_HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_bodies_and_idle_connections_are_closed_at_their_deadlines() {
    let m = model();
    let addr = edge(
        &m,
        ConnLimits {
            headers: Duration::from_secs(1),
            body: Duration::from_secs(1),
            ..Default::default()
        },
    )
    .await;
    tokio::task::spawn_blocking(move || {
        let bound = Duration::from_secs(30);
        // Headers that never end.
        let mut half = TcpStream::connect(addr).unwrap();
        half.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            .unwrap();
        let got = until_closed(&mut half, bound);
        assert!(!got.contains("200 OK"), "{got}");
        // A body that never ends: 408.
        let mut slow = TcpStream::connect(addr).unwrap();
        slow.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
              content-length: 100\r\n\r\n{\"model\":",
        )
        .unwrap();
        let got = until_closed(&mut slow, bound);
        assert!(got.starts_with("HTTP/1.1 408"), "{got}");
        // A kept-alive connection answered once, then idle.
        let mut idle = TcpStream::connect(addr).unwrap();
        idle.write_all(GET_HEALTH).unwrap();
        let got = until_closed(&mut idle, bound);
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        // The server serves on.
        let (status, _) = common::http(addr, "GET", "/health", "");
        assert_eq!(status, 200);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_share_of_connections() {
    let m = model();
    let addr = edge(
        &m,
        ConnLimits {
            headers: Duration::from_secs(120),
            per_peer: 3,
            ..Default::default()
        },
    )
    .await;
    tokio::task::spawn_blocking(move || {
        // Three connections the server has taken: each answered once, then kept alive.
        let held: Vec<TcpStream> = (0..3)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(GET_HEALTH).unwrap();
                let got = until_closed_or_answered(&mut s);
                assert!(got.starts_with("HTTP/1.1 200"), "{got}");
                s
            })
            .collect();
        let mut fourth = TcpStream::connect(addr).unwrap();
        let _ = fourth.write_all(GET_HEALTH);
        let got = until_closed(&mut fourth, Duration::from_secs(30));
        assert_eq!(got, "", "a fourth connection from one address was served");
        // One place given back: a new connection is served.
        drop(held);
        let t = Instant::now();
        loop {
            let mut s = TcpStream::connect(addr).unwrap();
            let _ = s.write_all(GET_HEALTH);
            let got = until_closed_or_answered(&mut s);
            if got.starts_with("HTTP/1.1 200") {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "never served again: {got}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .unwrap();
}

/// The first bytes of an answer, or nothing if the server closes first.
fn until_closed_or_answered(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0; 64];
    match s.read(&mut buf) {
        Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
        Err(_) => String::new(),
    }
}
