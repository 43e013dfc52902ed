//! The fleet as real processes on this machine, each pinned (`taskset`) to the cores its node
//! owns: a cloud node and edge servers behind their own shaped links (EdgePrompt), or one
//! server answering everything (cloud-only: ours, or llama.cpp's `llama-server`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::soak::cluster::wait_port;
use crate::soak::procs::{free_port, Proc};
use crate::BenchError;

fn s(x: impl ToString) -> String {
    x.to_string()
}

/// The processes of one setup, up and answering.
pub struct Nodes {
    pub procs: Vec<Proc>,
    /// `http://127.0.0.1:port/v1` of each server clients call (the edges, or the cloud-only
    /// server).
    pub urls: Vec<String>,
    /// Index in `procs` of each process the per-node table reports (cloud first; links too).
    pub named: Vec<(String, usize)>,
    /// Index in `named` of each of `urls`.
    pub url_node: Vec<usize>,
}

pub struct Launch<'a> {
    pub edgeprompt: &'a Path,
    pub dir: &'a Path,
    pub t0: Instant,
}

/// The cores `n` nodes get on this machine, one each, round-robin after node 0's.
pub fn core_of(node: usize, cores: usize) -> String {
    s(node % cores.max(1))
}

pub fn all_cores(cores: usize) -> String {
    format!("0-{}", cores.max(1) - 1)
}

fn pinned(name: &str, cores: &str, program: &Path, args: &[String], t0: Instant) -> Proc {
    let mut a = vec![s("-c"), s(cores), program.display().to_string()];
    a.extend_from_slice(args);
    Proc::new(name, "taskset", &a, t0)
}

impl Launch<'_> {
    /// A cloud node on core 0 and `edges` edge servers, edge `i` on core `i + 1` (mod the
    /// cores), each behind its own `link` process.
    #[allow(clippy::too_many_arguments)]
    pub fn edgeprompt(
        &self,
        cloud_model: &Path,
        edge_model: &Path,
        adapters: Option<&Path>,
        split: usize,
        prompts_toml: &Path,
        edges: usize,
        link: &str,
        cores: usize,
    ) -> Result<Nodes, BenchError> {
        let cloud_port = free_port()?;
        let mut args = vec![
            s("cloud"),
            s("--model"),
            cloud_model.display().to_string(),
            s("--prompts"),
            prompts_toml.display().to_string(),
            s("--listen"),
            format!("127.0.0.1:{cloud_port}"),
        ];
        if let Some(a) = adapters {
            args.extend([s("--adapters"), a.display().to_string()]);
        }
        let mut procs = vec![
            pinned("cloud", &core_of(0, cores), self.edgeprompt, &args, self.t0)
                .env("RUST_LOG", "warn"),
        ];
        let mut named = vec![(s("cloud"), 0)];
        let (mut urls, mut url_node) = (Vec::new(), Vec::new());
        let mut wait = vec![cloud_port];
        for i in 0..edges {
            let link_port = free_port()?;
            named.push((format!("link{i}"), procs.len()));
            procs.push(Proc::link(
                &format!("link{i}"),
                self.edgeprompt,
                link_port,
                cloud_port,
                link,
                self.t0,
            ));
            let port = free_port()?;
            procs.push(
                pinned(
                    &format!("edge{i}"),
                    &core_of(i + 1, cores),
                    self.edgeprompt,
                    &[
                        s("serve"),
                        s("--model"),
                        edge_model.display().to_string(),
                        s("--cloud"),
                        format!("http://127.0.0.1:{link_port}"),
                        s("--listen"),
                        format!("127.0.0.1:{port}"),
                        s("--cloud-layers-from"),
                        s(split),
                        // The cloud's key pinned for this run only.
                        s("--known-clouds"),
                        self.dir
                            .join(format!("edge{i}-known-clouds"))
                            .display()
                            .to_string(),
                        s("--max-queue"),
                        s(4096),
                        s("--kv-budget-mb"),
                        s(4096),
                        // Fetched on first use, as the simulator (and CE-LSLM's fleet) has it:
                        // the first request of each prompt measures the fetch.
                        s("--prefetch-mb"),
                        s(0),
                    ],
                    self.t0,
                )
                .env("RUST_LOG", "warn"),
            );
            named.push((format!("edge{i}"), procs.len() - 1));
            url_node.push(named.len() - 1);
            urls.push(format!("http://127.0.0.1:{port}/v1"));
            wait.push(link_port);
        }
        let nodes = Nodes {
            procs,
            urls,
            named,
            url_node,
        };
        self.start(nodes, &wait)
    }

    /// Cloud-only, ours: the cloud model serving every request on all cores, the cloud
    /// prompts computed and cached where they are first used.
    pub fn cloud_only(&self, cloud_model: &Path, cores: usize) -> Result<Nodes, BenchError> {
        let port = free_port()?;
        let p = pinned(
            "cloud-only",
            &all_cores(cores),
            self.edgeprompt,
            &[
                s("serve"),
                s("--model"),
                cloud_model.display().to_string(),
                s("--listen"),
                format!("127.0.0.1:{port}"),
                s("--max-queue"),
                s(4096),
                s("--kv-budget-mb"),
                s(4096),
            ],
            self.t0,
        )
        .env("RUST_LOG", "warn");
        let nodes = Nodes {
            procs: vec![p],
            urls: vec![format!("http://127.0.0.1:{port}/v1")],
            named: vec![(s("cloud"), 0)],
            url_node: vec![0],
        };
        self.start(nodes, &[])
    }

    /// Cloud-only, llama.cpp's C++ server on the same GGUF and cores: `slots` parallel
    /// sequences with continuous batching and its prompt cache.
    pub fn llama_server(
        &self,
        server: &Path,
        cloud_model: &Path,
        model_id: &str,
        slots: usize,
        cores: usize,
    ) -> Result<(Nodes, String), BenchError> {
        let port = free_port()?;
        let args = vec![
            s("-m"),
            cloud_model.display().to_string(),
            s("--alias"),
            s(model_id),
            s("-t"),
            s(cores),
            s("-np"),
            s(slots),
            s("-c"),
            s(slots * 2048),
            s("--host"),
            s("127.0.0.1"),
            s("--port"),
            s(port),
            s("--metrics"),
        ];
        let lib = server
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let p = pinned("llama-server", &all_cores(cores), server, &args, self.t0)
            .env("LD_LIBRARY_PATH", &lib);
        let nodes = Nodes {
            procs: vec![p],
            urls: vec![format!("http://127.0.0.1:{port}/v1")],
            named: vec![(s("cloud"), 0)],
            url_node: vec![0],
        };
        let described = format!("llama-server {}", args[4..10].join(" "));
        Ok((self.start(nodes, &[])?, described))
    }

    fn start(&self, mut n: Nodes, ports: &[u16]) -> Result<Nodes, BenchError> {
        for p in n.procs.iter_mut() {
            p.start()?;
        }
        for &port in ports {
            wait_port(port, Duration::from_secs(180))?;
        }
        for url in &n.urls {
            let health = url.trim_end_matches("/v1").to_string() + "/health";
            let until = Instant::now() + Duration::from_secs(300);
            loop {
                let ok = std::process::Command::new("curl")
                    .args(["-sf", "-o", "/dev/null", &health])
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    break;
                }
                if Instant::now() > until {
                    let tails: Vec<String> = n.procs.iter().map(|p| p.tail(20)).collect();
                    return Err(BenchError::Data(format!(
                        "{health} did not answer; output:\n{}",
                        tails.join("\n")
                    )));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            // An edge up before its cloud finds the cloud's list shortly after: wait for it,
            // so the warm-up fetches the prompts instead of computing them here.
            let listed = url.to_string() + "/cloud_prompts";
            let until = Instant::now() + Duration::from_secs(120);
            while Instant::now() < until {
                let out = std::process::Command::new("curl")
                    .args(["-s", &listed])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                if !out.contains("\"unreachable\"") {
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(n)
    }
}

/// CPU seconds a process has used (user + system), from `/proc`.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / clock_ticks())
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// The `[[prompt]]` file the cloud node reads.
pub fn prompts_toml(dir: &Path, prompts: &[String]) -> Result<PathBuf, BenchError> {
    let mut toml = String::new();
    for (i, p) in prompts.iter().enumerate() {
        let quoted = serde_json::to_string(p)?;
        toml += &format!("[[prompt]]\nid = \"p{i}\"\nsystem = {quoted}\n\n");
    }
    std::fs::create_dir_all(dir)?;
    let path = dir.join("prompts.toml");
    std::fs::write(&path, toml)?;
    Ok(path)
}
