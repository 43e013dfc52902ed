//! A flood of large request bodies leaves `edgeprompt serve` as it found it: each endpoint
//! takes at most what the model's context could hold (a larger body is a 413 in the API's
//! error shape), large bodies are handled two at a time, and the memory they took is given
//! back to the system: the process's RSS after the flood is within 64 MB of before.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// POST `body`; a server that answers before reading it all may close the socket under the
/// writer, so write errors are not the test's concern: the answer is.
fn send(addr: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = s
        .write_all(head.as_bytes())
        .and_then(|_| s.write_all(body.as_bytes()));
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out);
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |x| x.1);
    (status, serde_json::from_str(body).unwrap_or_default())
}

fn rss_mb(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

#[test]
fn large_bodies_are_bounded_per_endpoint_and_their_memory_given_back() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_edgeprompt"))
        .args(["serve", "--model", "smollm2", "--listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start edgeprompt serve");
    let err = child.stderr.take().expect("stderr");
    let server = Server(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("on http://").nth(1) {
                let _ = tx.send(rest.split('/').next().unwrap_or("").to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("server did not say where it listens");
    let text = |bytes: usize| "The quick brown fox jumps over the lazy dog. ".repeat(bytes / 45);
    let tokenize = |bytes: usize| serde_json::json!({"content": text(bytes)}).to_string();
    // SmolLM2's 8192-token context: text endpoints take 320 KB. Past it: refused before it is
    // read whole, in the API's error shape.
    let chat = serde_json::json!({"model": "smollm2", "messages": [{"role": "user", "content": text(4 << 20)}]});
    for (path, body) in [
        ("/tokenize", tokenize(4 << 20)),
        ("/v1/chat/completions", chat.to_string()),
    ] {
        let (status, v) = send(&addr, path, &body);
        assert_eq!(status, 413, "{path}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("larger"), "{v}");
    }
    // Within it: answered. Once first, so the tokenizer's own caches are in the baseline.
    let body = tokenize(250 << 10);
    assert_eq!(send(&addr, "/tokenize", &body).0, 200);
    let pid = server.0.id();
    let before = rss_mb(pid);
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let (addr, body) = (addr.clone(), body.clone());
            std::thread::spawn(move || send(&addr, "/tokenize", &body).0)
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 200);
    }
    let after = rss_mb(pid);
    println!(
        "serve RSS {before:.0} MB before 16 concurrent {} KB tokenize requests, {after:.0} MB after",
        body.len() >> 10
    );
    assert!(
        after - before < 64.0,
        "the flood left {:.0} MB behind",
        after - before
    );
}
