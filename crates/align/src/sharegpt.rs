//! ShareGPT text, for calibration here and for the benchmarks' workloads. The packaged JSON is truncated, so records are parsed one by
//! one and the incomplete tail is dropped.

use std::path::Path;

use crate::{AlignError, Result};

/// Texts of the conversation turns of up to `max_records` complete records.
pub fn turns(path: &Path, max_records: usize) -> Result<Vec<String>> {
    Ok(conversations(path, max_records)?
        .into_iter()
        .flatten()
        .map(|t| t.text)
        .collect())
}

/// One turn: `from` is "human" or "gpt" (other speakers are kept as named).
#[derive(Debug, Clone)]
pub struct Turn {
    pub from: String,
    pub text: String,
}

/// The conversations of up to `max_records` complete records, in file order.
pub fn conversations(path: &Path, max_records: usize) -> Result<Vec<Vec<Turn>>> {
    let bytes = std::fs::read(path).map_err(|e| AlignError::File {
        path: path.display().to_string(),
        msg: e.to_string(),
    })?;
    let mut pos = bytes
        .iter()
        .position(|&b| b == b'[')
        .ok_or_else(|| AlignError::Calibration("ShareGPT: no JSON array".into()))?
        + 1;
    let mut out = Vec::new();
    for _ in 0..max_records {
        while pos < bytes.len() && matches!(bytes[pos], b' ' | b'\n' | b'\r' | b'\t' | b',') {
            pos += 1;
        }
        let mut it =
            serde_json::Deserializer::from_slice(&bytes[pos..]).into_iter::<serde_json::Value>();
        let rec = match it.next() {
            Some(Ok(v)) => v,
            _ => break, // the truncated tail
        };
        pos += it.byte_offset();
        if let Some(conv) = rec["conversations"].as_array() {
            out.push(
                conv.iter()
                    .filter_map(|t| {
                        Some(Turn {
                            from: t["from"].as_str().unwrap_or_default().to_string(),
                            text: t["value"].as_str()?.to_string(),
                        })
                    })
                    .collect(),
            );
        }
    }
    Ok(out)
}
