//! What a run ran on: CPU, cores, SIMD level and the source revision (printed with every
//! benchmark and calibration result).

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub simd: Vec<&'static str>,
    /// The kernel path the engine runs (`EDGEPROMPT_AVX2` and the like hold it below `simd`).
    pub kernels: &'static str,
    pub git_rev: String,
}

/// A VM often names its CPU only by brand ("AMD EPYC"); the family and model numbers tell
/// its generations apart (an AMD family 25 model 17 is a Zen 4, family 26 a Zen 5).
fn with_generation(cpu: String) -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.split(':').next().map(str::trim) == Some(name))
            .and_then(|l| l.split(':').nth(1))
            .map(|x| x.trim().to_string())
    };
    match (field("cpu family"), field("model")) {
        (Some(f), Some(m)) if !cpu.contains(" family ") => format!("{cpu} (family {f}, model {m})"),
        _ => cpu,
    }
}

impl Machine {
    pub fn detect() -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|x| x.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let cpu = with_generation(cpu);
        let mut simd = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") {
                simd.push("avx2");
            }
            if is_x86_feature_detected!("avx512f") {
                simd.push("avx512f");
            }
            if is_x86_feature_detected!("avx512vnni") {
                simd.push("avx512vnni");
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            simd.push("neon");
            if std::arch::is_aarch64_feature_detected!("dotprod") {
                simd.push("dotprod");
            }
            if std::arch::is_aarch64_feature_detected!("i8mm") {
                simd.push("i8mm");
            }
        }
        let git_rev = git_rev();
        Self {
            cpu,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            simd,
            kernels: crate::kernels::LEVEL.name(),
            git_rev,
        }
    }
}

/// The checkout's revision, `-dirty` when its code differs from it, and a warning when this
/// binary is older than a source file (a run of an old build must not carry a newer revision
/// unmarked).
fn git_rev() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let Some(mut rev) = git(&["rev-parse", "--short", "HEAD"]) else {
        return "unknown".into();
    };
    let code = ["--", "crates", "Cargo.toml", "Cargo.lock"];
    if git(&[
        &["status", "--porcelain", "--untracked-files=no"][..],
        &code[..],
    ]
    .concat())
    .is_some_and(|s| !s.is_empty())
    {
        rev.push_str("-dirty");
    }
    // Sources written after the binary (an edit, a checkout, a stash) mean it may not be
    // the code this revision names.
    let top = git(&["rev-parse", "--show-toplevel"]).unwrap_or_default();
    let mtime = |p: &str| {
        std::fs::metadata(std::path::Path::new(&top).join(p))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
    };
    let newest = git(&[&["ls-files", "--full-name"][..], &code[1..]].concat())
        .and_then(|files| files.lines().filter_map(mtime).max());
    let built = std::env::current_exe()
        .ok()
        .and_then(|p| p.to_str().and_then(mtime));
    if let (Some(src), Some(bin)) = (newest, built) {
        if bin < src {
            rev.push_str(" (binary older than its sources)");
        }
    }
    rev
}

/// `AMD EPYC (2 cores, avx2/avx512f; kernels avx2), rev abc1234`: the line results are
/// printed under.
impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} cores, {}; kernels {}), rev {}",
            self.cpu,
            self.cores,
            self.simd.join("/"),
            self.kernels,
            self.git_rev
        )
    }
}

/// How every timed or calibrated run starts: the global thread pool sized to `threads` (a
/// no-op if one exists) and the machine description.
pub fn start(threads: usize) -> Machine {
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global();
    Machine::detect()
}

/// Peak resident memory of this process so far (VmHWM), bytes.
pub fn peak_rss() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// Restart the peak (VmHWM) from the resident size now, so that a later `peak_rss` covers
/// only what follows (a benchmark's own probe buffers are not the engine's). False where the
/// kernel does not allow it (not Linux).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Resident memory of this process now (VmRSS), bytes.
pub fn rss() -> Option<u64> {
    status_bytes("VmRSS:")
}

fn status_bytes(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
