//! Every kernel path gives the same bits on a real model: this test runs a short prompt and a
//! few decode steps in-process (the SIMD path this CPU picks), then runs itself again in a
//! child process with `EDGEPROMPT_PORTABLE=1` (the scalar reference path: GGUF rows unpacked
//! one by one, scalar block dots, scalar attention and SiLU) and compares every logit bit for
//! bit; on an AVX-512 VNNI machine once more with `EDGEPROMPT_AVX2=1` (the AVX2 dots), and with
//! `EDGEPROMPT_256=1` (256-bit VNNI tiles) where the 512-bit GEMM runs. Both
//! models cover q4_1, q5_0, q8_0, q4_K and q6_K.

mod common;

use edgeprompt_engine::kernels::LEVEL;
use edgeprompt_engine::{Model, Sequence};

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
    let mut forced = vec!["EDGEPROMPT_PORTABLE"];
    if LEVEL.vnni() {
        forced.push("EDGEPROMPT_AVX2");
    }
    if LEVEL.wide() {
        forced.push("EDGEPROMPT_256");
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
    let run = std::process::Command::new(std::env::current_exe().unwrap())
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
