//! Model names resolve from any working directory, and a missing model says where it looked.

use std::process::Command;

fn edgeprompt() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_edgeprompt"));
    c.env_remove("EDGEPROMPT_MODELS");
    c
}

#[test]
fn a_model_name_resolves_outside_the_checkout() {
    let elsewhere = tempfile::tempdir().unwrap();
    let out = edgeprompt()
        .args(["info", "--model", "smollm2"])
        .current_dir(elsewhere.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["config"]["n_layer"], 30, "SmolLM2-135M has 30 layers");
}

#[test]
fn a_missing_model_names_every_place_looked() {
    let empty = tempfile::tempdir().unwrap();
    let out = edgeprompt()
        .env("EDGEPROMPT_MODELS", empty.path())
        .args(["info", "--model", "qwen15"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&empty.path().display().to_string()), "{err}");
    assert!(err.contains("scripts/models.py qwen15"), "{err}");
}
