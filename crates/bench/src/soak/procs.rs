//! Real processes for the soak: started, killed with SIGKILL or stopped with SIGTERM, and
//! started again with the same command; every output line kept with its time, so faults,
//! recoveries and panics can be read back.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::BenchError;

/// Output lines of a process (all its lives), each with seconds since the run's start.
pub type Log = Arc<Mutex<Vec<(f64, String)>>>;

pub struct Proc {
    pub name: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
    pub log: Log,
    t0: Instant,
}

impl Proc {
    pub fn new(name: &str, program: impl Into<PathBuf>, args: &[String], t0: Instant) -> Self {
        Self {
            name: name.into(),
            program: program.into(),
            args: args.to_vec(),
            env: Vec::new(),
            child: None,
            log: Arc::default(),
            t0,
        }
    }

    /// `edgeprompt link` on `listen`, shaping the way to the cloud on `upstream` as `profile`.
    pub fn link(
        name: &str,
        edgeprompt: &std::path::Path,
        listen: u16,
        upstream: u16,
        profile: &str,
        t0: Instant,
    ) -> Self {
        let args = [
            "link".to_string(),
            "--listen".into(),
            format!("127.0.0.1:{listen}"),
            "--upstream".into(),
            format!("127.0.0.1:{upstream}"),
            "--profile".into(),
            profile.into(),
        ];
        Self::new(name, edgeprompt, &args, t0)
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn start(&mut self) -> Result<(), BenchError> {
        let mut c = Command::new(&self.program);
        c.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &self.env {
            c.env(k, v);
        }
        let mut child = c.spawn().map_err(|e| {
            BenchError::Data(format!(
                "starting {} ({}): {e}",
                self.name,
                self.program.display()
            ))
        })?;
        let outs: Vec<Box<dyn std::io::Read + Send>> = vec![
            Box::new(child.stdout.take().expect("piped")),
            Box::new(child.stderr.take().expect("piped")),
        ];
        for out in outs {
            let (log, t0) = (self.log.clone(), self.t0);
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if let Ok(mut l) = log.lock() {
                        l.push((t0.elapsed().as_secs_f64(), line));
                    }
                }
            });
        }
        self.child = Some(child);
        Ok(())
    }

    /// The running process's id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL, no warning: what a crash or an OOM kill looks like.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait up to `within` for the exit; SIGKILL after that. The exit code.
    pub fn term(&mut self, within: Duration) -> Option<i32> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let until = Instant::now() + within;
        while Instant::now() < until {
            if let Ok(Some(s)) = c.try_wait() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }

    /// Wait until a line containing `pat` appears at or after `since` (seconds of the run).
    pub fn wait_line(
        &mut self,
        pat: &str,
        since: f64,
        within: Duration,
    ) -> Result<f64, BenchError> {
        let until = Instant::now() + within;
        loop {
            if let Some(t) = self.line_after(pat, since) {
                return Ok(t);
            }
            if let Some(Ok(Some(s))) = self.child.as_mut().map(|c| c.try_wait()) {
                return Err(BenchError::Data(format!(
                    "{} exited ({s}) before saying {pat:?}; its output:\n{}",
                    self.name,
                    self.tail(30)
                )));
            }
            if Instant::now() >= until {
                return Err(BenchError::Data(format!(
                    "{} did not say {pat:?} in {within:?}; its output:\n{}",
                    self.name,
                    self.tail(30)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Time of the first line containing `pat` at or after `since`.
    pub fn line_after(&self, pat: &str, since: f64) -> Option<f64> {
        let l = self.log.lock().ok()?;
        l.iter()
            .find(|(t, s)| *t >= since && s.contains(pat))
            .map(|(t, _)| *t)
    }

    pub fn tail(&self, n: usize) -> String {
        self.log.lock().map_or(String::new(), |l| {
            l.iter()
                .skip(l.len().saturating_sub(n))
                .map(|(t, s)| format!("  [{t:7.2}] {s}"))
                .collect::<Vec<_>>()
                .join("\n")
        })
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A loopback port free now, for a process to bind a little later. Taken from below the
/// kernel's ephemeral range where there is room: a port `bind(0)` gives comes from that range,
/// and an outgoing connection (a cloud reaching Redis) could take it as its own local port
/// before the process it was meant for binds it (an edge once lost its peer port that way and
/// exited). Never the same port twice in one run.
pub fn free_port() -> Result<u16, BenchError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOWEST: u32 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let span = ephemeral_low.saturating_sub(LOWEST);
    if span < 1000 {
        return Ok(std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port());
    }
    // A different start per process, so two harnesses at once rarely meet.
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOWEST + (start + n) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(BenchError::Data("no free loopback port".into()))
}
