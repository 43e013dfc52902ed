//! The wire is unchanged by the move to the `.proto`: the List reply and Fetch streams a cloud
//! of the version before it sent (`tests/fixtures/wire/`, captured from a running `edgeprompt
//! cloud` with raw gRPC calls by `crates/cli/tests/protocol/capture_wire.py`, whose requests,
//! also kept, it encoded from the `.proto`) decode with today's types and encode back to the
//! same bytes.

use std::path::PathBuf;

use edgeprompt_kv::Chunk;
use edgeprompt_protocol::{
    fetch_message::Body, FetchMessage, FetchRequest, ListReply, ListRequest, PromptRef,
};
use prost::Message;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/wire")
}

fn same<M: Message + Default>(bytes: &[u8]) -> M {
    let m = M::decode(bytes).unwrap();
    assert_eq!(m.encode_to_vec(), bytes, "re-encoded bytes differ");
    m
}

#[test]
fn captured_messages_decode_and_encode_to_the_same_bytes() {
    let index: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&std::fs::read(dir().join("index.json")).unwrap()).unwrap();
    let (mut headers, mut chunks) = (0, 0);
    for (file, ty) in &index {
        let bytes = std::fs::read(dir().join(file)).unwrap();
        match ty.as_str().unwrap() {
            "edgeprompt.v1.FetchRequest" => {
                let r: FetchRequest = same(&bytes);
                assert!(matches!(r.prompt, Some(PromptRef::Id(_))), "{file}");
                assert_eq!(r.model_fingerprint.len(), 64, "{file}");
                assert!(!r.accept_codecs.is_empty(), "{file}");
            }
            "edgeprompt.v1.ListRequest" => {
                let r: ListRequest = same(&bytes);
                assert_eq!(r.model_fingerprint.len(), 64);
            }
            "edgeprompt.v1.ListReply" => {
                let r: ListReply = same(&bytes);
                assert_eq!(r.signing_key.len(), 32);
                assert_eq!(r.signature.len(), 64);
                assert!(r.prompts.iter().all(|p| p.content_address.len() == 32));
                assert!(!r.prompts.is_empty());
            }
            "edgeprompt.v1.FetchMessage" => match same::<FetchMessage>(&bytes).body {
                Some(Body::Header(h)) => {
                    headers += 1;
                    assert!(!h.token_ids.is_empty() && h.n_layers > 0, "{file}");
                    assert_eq!(h.content_address.len(), 32, "{file}");
                }
                Some(Body::Chunk(w)) => {
                    chunks += 1;
                    let c = Chunk::try_from(w).unwrap();
                    c.verify().unwrap();
                }
                None => panic!("{file}: an empty message"),
            },
            other => panic!("{file}: unknown type {other}"),
        }
    }
    assert!(
        headers >= 2 && chunks >= 4,
        "{headers} headers, {chunks} chunks"
    );
}
