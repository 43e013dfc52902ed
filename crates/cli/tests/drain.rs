//! SIGTERM on a real `edgeprompt serve` process: the stream in flight completes, new requests
//! get 503 with `Retry-After`, the process exits 0, and the next start reads the disk cache
//! it left (and answers the same request with the same text).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

const SYSTEM: &str = "You are a patient teacher of geography.";

const CHAT: &str = r#"{"model":"smollm2","stream":STREAM,"max_tokens":MAX,"temperature":0,
"messages":[{"role":"system","content":"You are a patient teacher of geography."},
{"role":"user","content":"Describe the rivers of Europe, one by one."}]}"#;

fn chat(stream: bool, max_tokens: usize) -> String {
    CHAT.replace("STREAM", &stream.to_string())
        .replace("MAX", &max_tokens.to_string())
}

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `edgeprompt serve` on a free port (on the cloud at `cloud`, if any); returns once it
/// listens.
fn serve(cloud: Option<&str>, cache: &std::path::Path, drain_secs: u64) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_edgeprompt"))
        .args(["serve", "--model", "smollm2", "--listen", "127.0.0.1:0"])
        .args(cloud.map(|c| ["--cloud", c]).into_iter().flatten())
        // The cloud's key pinned for this test (kept across its restarts).
        .arg("--known-clouds")
        .arg(cache.join("known_clouds"))
        .arg("--cache-dir")
        .arg(cache)
        .args(["--drain-secs", &drain_secs.to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start edgeprompt serve");
    let err = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("[serve] {line}");
            if let Some(rest) = line.split("on http://").nth(1) {
                let _ = tx.send(rest.split('/').next().unwrap_or("").to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("server did not say where it listens");
    Server { child, addr }
}

/// One HTTP/1.1 request; the whole response (status line, headers, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read response");
    out
}

/// The text of an SSE chat stream, and whether it ended with `[DONE]` after a finish reason.
fn stream_text(raw: &str) -> (String, bool) {
    let mut text = String::new();
    let mut finished = false;
    for line in raw.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            return (text, finished);
        }
        let v: serde_json::Value = serde_json::from_str(data).expect("SSE JSON");
        assert!(v.get("error").is_none(), "stream failed: {data}");
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text += t;
        }
        finished |= v["choices"][0]["finish_reason"].is_string();
    }
    (text, false)
}

/// Start a streamed chat of `max_tokens`; returns once its first text is out, with what was
/// read so far.
fn open_stream(addr: &str, max_tokens: usize) -> (BufReader<TcpStream>, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let body = chat(true, max_tokens);
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(s);
    let mut raw = String::new();
    while !raw.contains("\"content\"") {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "stream ended early"
        );
        raw += &line;
    }
    (reader, raw)
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(120), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `serve` fetches the cloud's published prompts as soon as it has the list, before any
/// request (so no fetch depends on which system messages the edge sees).
#[test]
fn serve_prefetches_the_published_prompts_before_any_request() {
    let cache = tempfile::tempdir().unwrap();
    let cloud_dir = tempfile::tempdir().unwrap();
    let (_cloud, cloud) = common::cloud(cloud_dir.path(), SYSTEM);
    let server = serve(Some(&cloud), cache.path(), 5);
    wait_until("the published prompt prefetched", || {
        http(&server.addr, "GET", "/metrics", "")
            .lines()
            .filter_map(|l| l.strip_prefix("edgeprompt_cloud_kv_bytes_total "))
            .any(|n| n.trim().parse::<f64>().is_ok_and(|n| n > 0.0))
    });
}

#[test]
fn sigterm_drains_then_exits_zero_and_the_disk_cache_serves_the_next_start() {
    let cache = tempfile::tempdir().unwrap();
    // The system message is the cloud's: the edge fetches it and keeps it on disk.
    let cloud_dir = tempfile::tempdir().unwrap();
    let (cloud_proc, cloud) = common::cloud(cloud_dir.path(), SYSTEM);
    // A drain deadline far beyond the stream: the drain ends when the stream does, however
    // busy the machine.
    let mut server = serve(Some(&cloud), cache.path(), 600);
    let addr = server.addr.clone();

    // A stream in flight: its first token is out before the signal.
    let (mut reader, mut raw) = open_stream(&addr, 160);
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());

    // Alive but draining: /health says so, /ready and new API requests get 503.
    wait_until("health reports draining", || {
        http(&addr, "GET", "/health", "").contains("\"draining\"")
    });
    let ready = http(&addr, "GET", "/ready", "");
    assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
    let refused = http(&addr, "POST", "/v1/chat/completions", &chat(false, 8));
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.to_lowercase().contains("retry-after: 5"),
        "{refused}"
    );
    assert!(refused.contains("\"code\":\"draining\""), "{refused}");

    // The stream in flight completes.
    reader.read_to_string(&mut raw).unwrap();
    let (drained_text, finished) = stream_text(&raw);
    assert!(finished, "the stream was cut: {raw}");
    assert!(!drained_text.is_empty());

    let status = server.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "exit status {status}");

    // The disk tier holds the system prompt's KV, complete: the next start reads it and
    // gives the same answer to the same request.
    let stored: Vec<_> = std::fs::read_dir(cache.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "kv"))
        .collect();
    assert_eq!(stored.len(), 1, "one cloud prompt on disk");
    // The cloud is gone: the restarted edge checks the disk copy against the key it pinned.
    drop(cloud_proc);
    let again = serve(Some(&cloud), cache.path(), 600);
    let whole = http(
        &again.addr,
        "POST",
        "/v1/chat/completions",
        &chat(false, 160),
    );
    assert!(whole.starts_with("HTTP/1.1 200"), "{whole}");
    let body = whole.split("\r\n\r\n").nth(1).unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(body).expect("JSON body");
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str(),
        Some(drained_text.as_str())
    );
    let metrics = http(&again.addr, "GET", "/metrics", "");
    assert!(
        metrics.contains("edgeprompt_prefix_lookups_total{source=\"disk\"} 1"),
        "{metrics}"
    );
}

#[test]
fn a_drain_that_runs_out_of_time_ends_the_stream_with_a_reason_and_exits_zero() {
    let cache = tempfile::tempdir().unwrap();
    let mut server = serve(None, cache.path(), 1);
    let addr = server.addr.clone();
    let (mut reader, _) = open_stream(&addr, 4000);
    let pid = server.child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    assert!(
        rest.contains("the edge shut down before this answer was complete"),
        "{rest}"
    );
    // The error event is the stream's last message before `[DONE]` (the body is chunked, so
    // the raw text ends with the terminating chunk).
    let error_at = rest.find("shut down before").unwrap_or(0);
    let done_at = rest
        .find("data: [DONE]")
        .expect("the stream ends with [DONE]");
    assert!(
        error_at < done_at && !rest[error_at..].contains("\"delta\""),
        "{rest}"
    );
    assert_eq!(server.child.wait().unwrap().code(), Some(0));
}
