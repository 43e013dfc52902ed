//! What the product's process tests share: a real `edgeprompt cloud` on loopback.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The product binary, quiet but for warnings.
pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_edgeprompt"));
    c.env("RUST_LOG", "warn").env("RUST_BACKTRACE", "0");
    c
}

/// A child process killed when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `edgeprompt cloud` (SmolLM2) publishing `system` as prompt "support", its prompts file and
/// signing key in `dir`; its URL once it serves.
pub fn cloud(dir: &Path, system: &str) -> (Proc, String) {
    cloud_with(dir, system, "smollm2")
}

/// `cloud` running `model` (a name the binary knows, or a GGUF path).
pub fn cloud_with(dir: &Path, system: &str, model: &str) -> (Proc, String) {
    let prompts = dir.join("prompts.toml");
    let text = format!("[[prompt]]\nid = \"support\"\nsystem = {system:?}\n");
    std::fs::write(&prompts, text).unwrap();
    let mut child = bin()
        .args([
            "cloud",
            "--model",
            model,
            "--listen",
            "127.0.0.1:0",
            "--prompts",
        ])
        .arg(&prompts)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start edgeprompt cloud");
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("[cloud] {line}");
            if let Some(rest) = line
                .split(" on ")
                .nth(1)
                .filter(|_| line.contains("serving"))
            {
                let _ = tx.send(rest.split(' ').next().unwrap_or("").to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the cloud did not say where it serves");
    (Proc(child), format!("http://{addr}"))
}

/// Python with the tests' packages: $EDGEPROMPT_PYTHON, or the venv scripts/test.sh makes.
pub fn python() -> PathBuf {
    let p = std::env::var_os("EDGEPROMPT_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv-test/bin/python")
        });
    assert!(
        p.exists(),
        "{} missing: run `bash scripts/test.sh` (it installs the tests' Python packages) or set EDGEPROMPT_PYTHON",
        p.display()
    );
    p
}

/// Run a command to success: its stdout and stderr (both shown if it fails).
pub fn run(c: &mut Command) -> (String, String) {
    let out = c.output().expect("run");
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    assert!(out.status.success(), "{c:?} failed:\n{so}\n{se}");
    (so, se)
}
