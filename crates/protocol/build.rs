//! The service and its messages come from `proto/edgeprompt/v1/cloud_kv.proto`, the contract
//! other languages generate from. protox compiles it in Rust, so a build needs no `protoc`.

use std::path::PathBuf;

use prost::Message;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = "edgeprompt/v1/cloud_kv.proto";
    let fds = match protox::compile([file], [&root]) {
        Ok(fds) => fds,
        Err(e) => panic!("{file}: {e}"),
    };
    // The compiled descriptor, for the contract test and for tools that speak gRPC reflection.
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    if let Err(e) = std::fs::write(out.join("cloud_kv.fds"), fds.encode_to_vec()) {
        panic!("writing the descriptor: {e}");
    }
    if let Err(e) = tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)
    {
        panic!("generating {file}: {e}");
    }
    println!("cargo:rerun-if-changed={}", root.join(file).display());
}
