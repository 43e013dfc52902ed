//! Every kernel path gives the same bits on a real model: this test runs a short prompt and a
//! few decode steps in-process (the SIMD path this CPU picks), then runs itself again in a
//! child process with `EDGEPROMPT_PORTABLE=1` (the portable path: the tiles in plain Rust,
//! scalar attention and SiLU; the kernels' unit tests hold it to the GGUF-row reference dot)
//! and compares every logit bit for bit; on an AVX-512 VNNI machine once more with `EDGEPROMPT_AVX2=1` (the AVX2 dots), and with
//! `EDGEPROMPT_256=1` (256-bit VNNI tiles) where the 512-bit GEMM runs; on aarch64 with
//! `EDGEPROMPT_NEON=1` and `EDGEPROMPT_DOTPROD=1` where the CPU has more. Both models cover
//! q4_1, q5_0, q8_0, q4_K and q6_K. The bits are also checked against a committed fixture
//! (`fixtures/logit_bits.json`), so every machine, not only every path of one, gives the same.
//! Under emulation (`scripts/aarch64.sh`) `EDGEPROMPT_TEST_RUNNER` names the emulator the
//! child runs under.

mod common;

use edgeprompt_engine::kernels::{Level, LEVEL};
use edgeprompt_engine::{Model, Sequence};
use sha2::{Digest, Sha256};

const CHILD: &str = "EDGEPROMPT_KERNEL_PATHS_OUT";

/// Logit bits of a 12-token prompt (two chunks) and 3 greedy decode steps.
fn logit_bits(model: &Model) -> Vec<u32> {
    let ids = model
        .tokenizer
        .encode("The kernels must agree: fn main() { println!(\"ok\"); }")
        .unwrap();
    let ids = &ids[..ids.len().min(12)];
    let mut seq = Sequence::new(model);
    let mut logits = seq.prefill_chunked(model, ids, 5).unwrap();
    let mut bits: Vec<u32> = logits.iter().map(|x| x.to_bits()).collect();
    for _ in 0..3 {
        let next = edgeprompt_engine::sample::argmax(&logits);
        logits = seq.prefill(model, &[next]).unwrap();
        bits.extend(logits.iter().map(|x| x.to_bits()));
    }
    bits
}

fn check(name: &str, model: &Model) {
    let bits = logit_bits(model);
    if let Some(out) = std::env::var_os(CHILD) {
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        std::fs::write(out, bytes).unwrap();
        return;
    }
    matches_fixture(name, &bits);
    let mut forced = vec!["EDGEPROMPT_PORTABLE"];
    for level in LEVEL.below() {
        forced.push(match level {
            Level::Avx2 => "EDGEPROMPT_AVX2",
            Level::Avx512Vnni => "EDGEPROMPT_256",
            Level::Neon => "EDGEPROMPT_NEON",
            Level::Dotprod => "EDGEPROMPT_DOTPROD",
            other => panic!("no variable forces {other:?}"),
        });
    }
    for var in forced {
        let other = child_bits(name, var);
        assert_eq!(other.len(), bits.len(), "{var}: logit counts differ");
        let differ = bits.iter().zip(&other).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{var}: {differ} of {} logits differ", bits.len());
    }
}

/// The logit bits of this test run again in a child process with `var` set.
fn child_bits(name: &str, var: &str) -> Vec<u32> {
    let out = std::env::temp_dir().join(format!(
        "edgeprompt-kernel-paths-{name}-{var}-{}",
        std::process::id()
    ));
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match std::env::var("EDGEPROMPT_TEST_RUNNER") {
        Ok(runner) => {
            let mut cmd = std::process::Command::new(runner);
            cmd.arg(exe);
            cmd
        }
        Err(_) => std::process::Command::new(exe),
    };
    let run = cmd
        .args([name, "--exact", "--include-ignored", "--test-threads", "1"])
        .env(var, "1")
        .env(CHILD, &out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{var} child run failed:\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let child = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    child
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The committed digest of every path's bits: `EDGEPROMPT_BLESS=1` writes it (once, on any
/// machine; every other run must then match it).
fn matches_fixture(name: &str, bits: &[u32]) {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/logit_bits.json");
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let digest: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut all: serde_json::Map<String, serde_json::Value> = std::fs::read(&path)
        .ok()
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap_or_default();
    let entry = serde_json::json!({ "logits": bits.len(), "sha256": digest });
    if std::env::var_os("EDGEPROMPT_BLESS").is_some() {
        all.insert(name.to_string(), entry);
        let text = serde_json::to_string_pretty(&all).unwrap();
        std::fs::write(&path, text + "\n").unwrap();
        return;
    }
    assert_eq!(
        all.get(name),
        Some(&entry),
        "{name} on the {} path: these logit bits differ from the committed fixture",
        LEVEL.name()
    );
}

#[test]
#[ignore = "slow: the scalar path runs a whole model"]
fn simd_and_portable_paths_agree_on_smollm2() {
    check(
        "simd_and_portable_paths_agree_on_smollm2",
        &common::smollm2(),
    );
}

#[test]
#[ignore = "slow: the scalar path runs a whole model"]
fn simd_and_portable_paths_agree_on_qwen05() {
    check("simd_and_portable_paths_agree_on_qwen05", &common::qwen05());
}
