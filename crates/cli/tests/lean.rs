//! The product binary links no benchmark code: neither the bench crate nor the baseline it
//! measures against (candle-transformers). Nor does its build run the protocol's code
//! generator (the generated code is committed and checked by
//! `crates/protocol/tests/generated.rs`), nor a second TLS stack: the object-store client
//! signs and encrypts with the ring that tonic uses, not aws-lc's C.

use std::process::Command;

#[test]
fn the_product_depends_on_no_benchmark_crate() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let tree_of = |extra: &[&str]| {
        Command::new(&cargo)
            .current_dir(&root)
            .args([
                "tree",
                "-p",
                "edgeprompt",
                "-e",
                "normal,build",
                "--prefix",
                "none",
            ])
            .args(extra)
            .output()
            .expect("cargo tree runs")
    };
    // Offline first (the build just fetched everything); the registry if that is not enough.
    let mut out = tree_of(&["--offline"]);
    if !out.status.success() {
        out = tree_of(&[]);
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    // The tree is the product's: its own components are in it.
    for needed in ["edgeprompt-engine", "edgeprompt-edge", "edgeprompt-align"] {
        assert!(names.contains(&needed), "{needed} missing from:\n{tree}");
    }
    for banned in [
        "edgeprompt-bench",
        "candle-transformers",
        "aws-lc-rs",
        "aws-lc-sys",
        "protox",
        "prost-build",
    ] {
        assert!(
            !names.contains(&banned),
            "the product binary depends on {banned}:\n{tree}"
        );
    }
}

/// An edge device downloads and stores the binary: as built by the README's commands (release,
/// no debug info) it stays small. Debug builds carry their debug info and are not measured.
#[test]
fn the_release_binary_is_small() {
    // About 25 MB: 20 before the object-store client (object_store, reqwest, rustls' root
    // certificates and verifier) joined the product.
    const MAX_MB: u64 = 27;
    if cfg!(debug_assertions) {
        return;
    }
    let bin = env!("CARGO_BIN_EXE_edgeprompt");
    let bytes = std::fs::metadata(bin).expect("the binary was built").len();
    println!("{bin}: {:.1} MB", bytes as f64 / 1e6);
    assert!(
        bytes <= MAX_MB * 1_000_000,
        "{bin} is {:.1} MB, more than {MAX_MB} MB: debug info or a new dependency?",
        bytes as f64 / 1e6
    );
}
