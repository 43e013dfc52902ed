//! API keys of a real `edgeprompt serve`: from EDGEPROMPT_API_KEYS (kept out of the process
//! list) as well as `--api-key`, which still works but warns that every local user sees it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Server {
    child: Child,
    addr: String,
    /// Everything the server wrote to stderr so far.
    log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn command(flags: &[&str], env: Option<&str>) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_edgeprompt"));
    c.args(["serve", "--model", "smollm2", "--listen", "127.0.0.1:0"])
        .args(flags)
        .env_remove("EDGEPROMPT_API_KEYS")
        .stderr(Stdio::piped());
    if let Some(v) = env {
        c.env("EDGEPROMPT_API_KEYS", v);
    }
    c
}

/// Start `edgeprompt serve`; returns once it listens.
fn serve(flags: &[&str], env: Option<&str>) -> Server {
    let mut child = command(flags, env).spawn().expect("start edgeprompt serve");
    let err = child.stderr.take().expect("stderr");
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let lines = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("[serve] {line}");
            if let Some(rest) = line.split("on http://").nth(1) {
                let _ = tx.send(rest.split('/').next().unwrap_or("").to_string());
            }
            lines.lock().unwrap().push(line);
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("server did not say where it listens");
    Server { child, addr, log }
}

/// The status of `GET /v1/models` with `key` as the bearer token.
fn status(addr: &str, key: Option<&str>) -> u16 {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let auth = key.map_or(String::new(), |k| format!("authorization: Bearer {k}\r\n"));
    write!(
        s,
        "GET /v1/models HTTP/1.1\r\nhost: {addr}\r\n{auth}connection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read response");
    out.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

const WARNING: &str = "visible to every local user in the process list";

#[test]
fn keys_come_from_the_environment_and_the_flag_warns() {
    let s = serve(
        &["--api-key", "sk-flag"],
        Some(" sk-env-a,sk-env-b\nsk-env-c\n"),
    );
    for key in ["sk-flag", "sk-env-a", "sk-env-b", "sk-env-c"] {
        assert_eq!(status(&s.addr, Some(key)), 200, "{key}");
    }
    assert_eq!(status(&s.addr, None), 401);
    assert_eq!(status(&s.addr, Some("sk-env")), 401);
    let warned = s.log.lock().unwrap().iter().any(|l| l.contains(WARNING));
    assert!(warned, "no warning about --api-key");
    drop(s);

    let s = serve(&[], Some("sk-env-only"));
    assert_eq!(status(&s.addr, Some("sk-env-only")), 200);
    assert_eq!(status(&s.addr, None), 401);
    let warned = s.log.lock().unwrap().iter().any(|l| l.contains(WARNING));
    assert!(!warned, "a warning without --api-key");
}

#[test]
fn an_environment_variable_with_no_key_is_refused() {
    // Set but empty would leave the API open by mistake.
    let out = command(&[], Some(" ,\n"))
        .output()
        .expect("run edgeprompt serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("EDGEPROMPT_API_KEYS is set but holds no API key"),
        "{err}"
    );
}
