//! A prompt's KV as a file other programs read (docs/protocol.md, "Exported KV"): what an edge
//! reassembled, for checking another implementation's decoders against ours, or for another
//! engine's cloud to serve.
//!
//! Layout: `EPKV`, u32 LE version (1; 2 for a hybrid model), u32 LE length of a UTF-8 JSON
//! header, the header, then for each layer, for each KV head, its keys then its values: rows of
//! `head_dim` f16 (LE) for positions `layer_starts[l]..token count` (the order a layer's digest
//! hashes); version 2 follows a recurrent layer's (empty) heads with its state, f32 LE as the
//! wire holds it, and names the recurrent layers and their shape in the header; version 3 (a
//! model whose layers differ: Gemma 4) names each layer's head size and the layer whose KV it
//! reads (`head_dims`, `kv_sources`): a layer's rows are of its own size, and a layer reading
//! another's holds none.

use std::io::Write;

use edgeprompt_engine::recurrent::Recurrence;
use edgeprompt_engine::PrefixKv;

use crate::{content_address, Codec, Result};

pub const MAGIC: &[u8; 4] = b"EPKV";
pub const VERSION: u32 = 1;
/// The version of an export that holds recurrent states.
pub const VERSION_STATES: u32 = 2;
/// The version of an export whose layers differ in head size or read others' KV.
pub const VERSION_LAYERS: u32 = 3;

#[derive(serde::Serialize)]
struct Header<'a> {
    prompt_id: &'a str,
    fingerprint: &'a str,
    address: String,
    token_ids: &'a [u32],
    n_layers: usize,
    n_kv_head: usize,
    head_dim: usize,
    first_layer: usize,
    layer_starts: Vec<usize>,
    /// The codec the values were decoded from.
    codec: &'static str,
    mapped: bool,
    /// The recurrent layers and their state's shape (version 2 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    state_shape: Option<StateShape>,
    /// Per layer, its head size and the layer whose KV it reads (version 3 only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    head_dims: Vec<usize>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    kv_sources: Vec<usize>,
}

/// The wire's `StateShape` (the kind by its enum name), and each state's floats.
#[derive(serde::Serialize)]
struct StateShape {
    layers: Vec<usize>,
    kind: &'static str,
    conv_kernel: usize,
    k_heads: usize,
    v_heads: usize,
    head_dim: usize,
    conv_channels: usize,
    /// Floats of each state's convolution window, then of its matrices.
    conv_floats: usize,
    matrix_floats: usize,
}

impl StateShape {
    fn new(s: Recurrence, layers: Vec<usize>) -> Self {
        let (kind, (k_heads, v_heads, head_dim)) = match s {
            Recurrence::DeltaNet(d) => ("GATED_DELTA_NET", (d.k_heads, d.v_heads, d.head_dim)),
            Recurrence::ShortConv(_) => ("SHORT_CONV", (0, 0, 0)),
        };
        Self {
            layers,
            kind,
            conv_kernel: s.conv_kernel(),
            k_heads,
            v_heads,
            head_dim,
            conv_channels: s.conv_dim(),
            conv_floats: s.conv_floats(),
            matrix_floats: s.matrix_floats(),
        }
    }
}

/// Write `prefix` (every layer, the model's own KV decoded from `codec`; the states of its
/// recurrent layers, of the model's `recurrence`) as an export.
pub fn write_export(
    out: &mut impl Write,
    prompt_id: &str,
    codec: Codec,
    recurrence: Option<Recurrence>,
    prefix: &PrefixKv,
) -> Result<()> {
    let recurrent: Vec<usize> = (0..prefix.layers.len())
        .filter(|&l| prefix.layers[l].state.is_some())
        .collect();
    let state_shape = match (recurrence, recurrent.is_empty()) {
        (_, true) => None,
        (Some(s), false) => Some(StateShape::new(s, recurrent)),
        (None, false) => {
            return Err(crate::KvError::Shape(
                "states in a prefix of a model without recurrent layers".into(),
            ))
        }
    };
    let first = prefix.layers.first();
    let map = crate::LayerMap::of_layers(&prefix.layers);
    let header = Header {
        prompt_id,
        fingerprint: &prefix.fingerprint,
        address: content_address(&prefix.fingerprint, &prefix.token_ids),
        token_ids: &prefix.token_ids,
        n_layers: prefix.layers.len(),
        n_kv_head: first.map_or(0, |l| l.n_kv_head),
        head_dim: first.map_or(0, |l| l.head_dim),
        first_layer: 0,
        layer_starts: prefix.layers.iter().map(|l| l.start()).collect(),
        codec: codec.name(),
        mapped: false,
        state_shape,
        head_dims: map.head_dims,
        kv_sources: map.kv_sources,
    };
    let version = match (&header.state_shape, header.head_dims.is_empty()) {
        (_, false) => VERSION_LAYERS,
        (Some(_), true) => VERSION_STATES,
        (None, true) => VERSION,
    };
    let json = serde_json::to_vec(&header).map_err(|e| crate::KvError::Store(e.to_string()))?;
    out.write_all(MAGIC)?;
    out.write_all(&version.to_le_bytes())?;
    out.write_all(&(json.len() as u32).to_le_bytes())?;
    out.write_all(&json)?;
    let mut buf = Vec::new();
    for layer in &prefix.layers {
        for h in 0..layer.n_kv_head {
            for part in [layer.keys(h), layer.values(h)] {
                buf.clear();
                buf.extend(part.iter().flat_map(|x| x.to_bits().to_le_bytes()));
                out.write_all(&buf)?;
            }
        }
        if let Some(st) = &layer.state {
            out.write_all(&st.to_le_bytes())?;
        }
    }
    Ok(())
}
