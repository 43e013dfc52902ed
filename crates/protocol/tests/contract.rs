//! The `.proto` is a contract with deployed edges and other languages' clients: every field
//! and method pinned in `proto/edgeprompt/v1/cloud_kv.fields` must stay as it is (name, number,
//! type, label, oneof). A field that is new must be added there; one that changed or went away
//! breaks v1 (docs/protocol.md, "Versioning").

use std::collections::BTreeSet;

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};

const PINNED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../proto/edgeprompt/v1/cloud_kv.fields"
);

fn message_lines(prefix: &str, m: &DescriptorProto, out: &mut BTreeSet<String>) {
    let name = format!("{prefix}.{}", m.name());
    for f in &m.field {
        let oneof = f
            .oneof_index
            .and_then(|i| m.oneof_decl.get(i as usize))
            .map_or(String::new(), |o| format!(" oneof={}", o.name()));
        let ty = match f.r#type() {
            Type::Message | Type::Enum => f.type_name().to_string(),
            t => t.as_str_name().trim_start_matches("TYPE_").to_lowercase(),
        };
        let label = match f.label() {
            Label::Repeated => "repeated",
            _ => "singular",
        };
        out.insert(format!(
            "field {name}.{} = {} {label} {ty}{oneof}",
            f.name(),
            f.number()
        ));
    }
    for nested in &m.nested_type {
        message_lines(&name, nested, out);
    }
}

/// One line per field and per method, as the compiled `.proto` has them.
fn contract() -> BTreeSet<String> {
    let fds = FileDescriptorSet::decode(edgeprompt_protocol::DESCRIPTOR).unwrap();
    let mut out = BTreeSet::new();
    for file in &fds.file {
        let pkg = format!(".{}", file.package());
        for m in &file.message_type {
            message_lines(&pkg, m, &mut out);
        }
        for s in &file.service {
            for m in &s.method {
                out.insert(format!(
                    "rpc {pkg}.{}.{}({}) returns ({}{})",
                    s.name(),
                    m.name(),
                    m.input_type(),
                    if m.server_streaming() { "stream " } else { "" },
                    m.output_type()
                ));
            }
        }
    }
    out
}

fn pinned() -> BTreeSet<String> {
    let text = std::fs::read_to_string(PINNED).unwrap();
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

/// What breaks v1 (pinned lines gone or changed) and what is new (lines to pin).
fn check(pinned: &BTreeSet<String>, now: &BTreeSet<String>) -> Result<(), String> {
    let list = |d: Vec<&String>| d.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n");
    let broken: Vec<_> = pinned.difference(now).collect();
    if !broken.is_empty() {
        return Err(format!(
            "changed or removed, which breaks deployed v1 edges and clients (a change they \
             cannot ignore is edgeprompt.v2):\n{}",
            list(broken)
        ));
    }
    let new: Vec<_> = now.difference(pinned).collect();
    if !new.is_empty() {
        return Err(format!(
            "new in the .proto: pin them in {PINNED} (a new field must be safe for v1 edges \
             to ignore):\n{}",
            list(new)
        ));
    }
    Ok(())
}

#[test]
fn the_proto_keeps_every_pinned_field_and_method() {
    if let Err(e) = check(&pinned(), &contract()) {
        panic!("{e}");
    }
}

#[test]
fn a_renumbered_retyped_or_removed_field_is_caught() {
    let line = "field .edgeprompt.v1.WireChunk.checksum = 7 singular fixed32";
    for change in [
        Some(line.replace("= 7", "= 9")),
        Some(line.replace("fixed32", "uint32")),
        None,
    ] {
        let mut now = contract();
        assert!(now.remove(line), "{line} is not in the contract");
        now.extend(change);
        let e = check(&pinned(), &now).unwrap_err();
        assert!(e.contains("breaks deployed v1") && e.contains(line), "{e}");
    }
    // A new field is not breaking, but must be pinned.
    let mut now = contract();
    now.insert("field .edgeprompt.v1.WireChunk.extra = 9 singular bytes".into());
    assert!(check(&pinned(), &now).unwrap_err().contains("pin them"));
}
