//! The gRPC service is declared in Rust (no .proto, no protoc): messages are prost derives in
//! src/lib.rs, and tonic's generator writes the client and server for them.

fn main() {
    let method = |name: &str, route: &str, input: &str, output: &str| {
        tonic_build::manual::Method::builder()
            .name(name)
            .route_name(route)
            .input_type(input)
            .output_type(output)
            .codec_path("tonic_prost::ProstCodec")
            .server_streaming()
            .build()
    };
    let service = tonic_build::manual::Service::builder()
        .name("CloudKv")
        .package("edgeprompt.v1")
        .method(method(
            "fetch",
            "Fetch",
            "crate::FetchRequest",
            "crate::FetchMessage",
        ))
        .method(
            tonic_build::manual::Method::builder()
                .name("list")
                .route_name("List")
                .input_type("crate::ListRequest")
                .output_type("crate::ListReply")
                .codec_path("tonic_prost::ProstCodec")
                .build(),
        )
        .build();
    tonic_build::manual::Builder::new().compile(&[service]);
    println!("cargo:rerun-if-changed=build.rs");
}
