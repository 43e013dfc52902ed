//! The committed Rust of the protocol (`src/generated/`) is what `proto/edgeprompt/v1/cloud_kv.proto`
//! generates today: the `.proto` stays the one source, and the product's build needs neither
//! the proto compiler nor the code generator. After changing the `.proto`, regenerate with
//! `EDGEPROMPT_REGENERATE=1 cargo test -p edgeprompt-protocol --test generated`.

use std::path::{Path, PathBuf};

use prost::Message;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The descriptor set and the generated Rust, made from the `.proto` as it is now.
fn generate(out: &Path) -> (Vec<u8>, String) {
    let root = crate_dir().join("../../proto");
    let fds = protox::compile(["edgeprompt/v1/cloud_kv.proto"], [&root]).unwrap();
    let bytes = fds.encode_to_vec();
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .out_dir(out)
        .compile_fds(fds)
        .unwrap();
    let rust = std::fs::read_to_string(out.join("edgeprompt.v1.rs")).unwrap();
    (bytes, rust)
}

#[test]
fn the_committed_code_is_what_the_proto_generates() {
    let tmp = tempfile::tempdir().unwrap();
    let (fds, rust) = generate(tmp.path());
    let dir = crate_dir().join("src/generated");
    let (fds_at, rust_at) = (dir.join("cloud_kv.fds"), dir.join("edgeprompt.v1.rs"));
    if std::env::var_os("EDGEPROMPT_REGENERATE").is_some() {
        std::fs::write(&fds_at, &fds).unwrap();
        std::fs::write(&rust_at, &rust).unwrap();
    }
    let how = "the .proto changed: regenerate with \
               EDGEPROMPT_REGENERATE=1 cargo test -p edgeprompt-protocol --test generated";
    assert!(
        std::fs::read(&fds_at).unwrap() == fds,
        "{}: {how}",
        fds_at.display()
    );
    assert!(
        std::fs::read_to_string(&rust_at).unwrap() == rust,
        "{}: {how}",
        rust_at.display()
    );
    // And the crate was built from those files.
    assert_eq!(edgeprompt_protocol::DESCRIPTOR, &fds[..]);
}
