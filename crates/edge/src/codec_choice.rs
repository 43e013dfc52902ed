//! `--codec auto`: the KV codec for each cloud fetch, chosen from the link this edge measures
//! and the codec quality table `edgeprompt-bench codecs` writes (`docs/results/codecs.json`).
//! Only codecs whose measured next-token agreement on this model reaches the floor are ever
//! used; among those, a smaller codec is taken only when the link makes it pay (the planner's
//! transfer term, EdgePrompt eq. 6), otherwise f16, which is exact.

use std::path::Path;
use std::time::Duration;

use edgeprompt_kv::Codec;

use crate::{EdgeError, Result};

/// A codec this model may use, with its size against f16 and its measured agreement.
#[derive(Debug, Clone, PartialEq)]
pub struct Quality {
    pub codec: Codec,
    /// f16 bytes / this codec's bytes.
    pub ratio: f64,
    pub agreement: f64,
}

pub use crate::link_meter::{LinkEstimate, LinkMeter};

/// A choice and why, for the log and `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub codec: Codec,
    pub reason: String,
}

/// Smallest saving (seconds of transfer) for which a lossy codec is used instead of f16.
const MIN_SAVING: Duration = Duration::from_millis(50);
/// Prompt length assumed when a fetch names the prompt by id (its length is not known yet).
const ASSUMED_TOKENS: usize = 1024;

#[derive(Debug)]
pub struct AutoCodec {
    /// Codecs that pass the floor (f16 not among them: it is always allowed).
    allowed: Vec<Quality>,
    /// Codecs refused on this model, with their agreement.
    refused: Vec<Quality>,
    pub min_agreement: f64,
    meter: LinkMeter,
}

impl AutoCodec {
    /// The policy for the model named `model` (GGUF `general.name`) from a codecs table.
    pub fn from_table(path: &Path, model: &str, min_agreement: f64) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| EdgeError::Config(format!("codec table {}: {e}", path.display())))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| EdgeError::Config(format!("codec table {}: {e}", path.display())))?;
        let rows = v["rows"].as_array().cloned().unwrap_or_default();
        let qualities: Vec<Quality> = rows
            .iter()
            .filter(|r| r["model"].as_str() == Some(model))
            .filter_map(|r| {
                Some(Quality {
                    codec: Codec::parse(r["codec"].as_str()?)?,
                    ratio: r["ratio_vs_f16"].as_f64()?,
                    agreement: r["next_token_agreement"].as_f64()?,
                })
            })
            .collect();
        Ok(Self::new(qualities, min_agreement))
    }

    pub fn new(qualities: Vec<Quality>, min_agreement: f64) -> Self {
        let (mut allowed, refused): (Vec<Quality>, Vec<Quality>) = qualities
            .into_iter()
            .filter(|q| q.codec != Codec::F16)
            .partition(|q| q.agreement >= min_agreement);
        // Smallest first: the first allowed codec that pays is the best one.
        allowed.sort_by(|a, b| b.ratio.total_cmp(&a.ratio));
        Self {
            allowed,
            refused,
            min_agreement,
            meter: LinkMeter::default(),
        }
    }

    pub fn allowed(&self) -> &[Quality] {
        &self.allowed
    }

    pub fn refused(&self) -> &[Quality] {
        &self.refused
    }

    pub fn link(&self) -> Option<LinkEstimate> {
        self.meter.link()
    }

    /// A fetch of `bytes` on the wire took `secs` after the header came `rtt` after the request.
    pub fn observe(&self, rtt: Duration, bytes: usize, secs: f64) {
        self.meter.observe(rtt, bytes, secs)
    }

    /// The codec for a prompt of `tokens` (None: named by id, length unknown) whose f16 KV is
    /// `f16_bytes_per_token` per token.
    pub fn choose(&self, tokens: Option<usize>, f16_bytes_per_token: usize) -> Choice {
        let f16 = |reason: String| Choice {
            codec: Codec::F16,
            reason,
        };
        let Some(link) = self.link() else {
            return f16("no link measured yet (f16 is exact; this fetch measures it)".into());
        };
        let Some(best) = self.allowed.first() else {
            return f16(format!(
                "no smaller codec reaches next-token agreement {:.3} on this model ({})",
                self.min_agreement,
                describe(&self.refused)
            ));
        };
        let n = tokens.unwrap_or(ASSUMED_TOKENS);
        let bytes = (n * f16_bytes_per_token) as f64;
        let full = bytes / link.bytes_per_sec;
        let small = bytes / best.ratio / link.bytes_per_sec;
        let saving = full - small;
        let measured = format!(
            "link {:.0} Mbit/s, RTT {:.0} ms; {n} tokens: f16 {:.3} s, {} {:.3} s on the wire",
            link.bytes_per_sec * 8.0 / 1e6,
            link.rtt.as_secs_f64() * 1e3,
            full,
            best.codec.name(),
            small
        );
        if saving < MIN_SAVING.as_secs_f64() {
            return f16(format!(
                "{measured}: saving under {MIN_SAVING:?}, f16 is exact"
            ));
        }
        Choice {
            codec: best.codec,
            reason: format!(
                "{measured}; agreement {:.3} >= {:.3}",
                best.agreement, self.min_agreement
            ),
        }
    }
}

fn describe(qs: &[Quality]) -> String {
    qs.iter()
        .map(|q| format!("{} {:.3}", q.codec.name(), q.agreement))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<Quality> {
        let q = |codec, ratio, agreement| Quality {
            codec,
            ratio,
            agreement,
        };
        vec![
            q(Codec::Int8, 1.94, 0.991),
            q(Codec::Int8Ch, 1.90, 0.996),
            q(Codec::Int4, 3.2, 0.865),
            q(Codec::Int4Ch, 3.5, 0.990),
        ]
    }

    #[test]
    fn only_codecs_over_the_floor_and_only_when_the_link_makes_them_pay() {
        let auto = AutoCodec::new(table(), 0.99);
        let names: Vec<&str> = auto.allowed().iter().map(|q| q.codec.name()).collect();
        assert_eq!(
            names,
            ["int4ch", "int8", "int8ch"],
            "smallest first, int4 refused"
        );
        // Nothing measured yet: f16, and the fetch measures the link.
        assert_eq!(auto.choose(Some(1000), 12_288).codec, Codec::F16);
        // 10 Mbit/s: 12 MB of f16 take ~10 s; int4ch saves ~7 s.
        auto.observe(Duration::from_millis(50), 1_250_000, 1.0);
        let c = auto.choose(Some(1000), 12_288);
        assert_eq!(c.codec, Codec::Int4Ch, "{}", c.reason);
        assert!(c.reason.contains("10 Mbit/s"), "{}", c.reason);
        // 10 Gbit/s: the saving is a few ms, f16 is exact.
        auto.observe(Duration::from_millis(1), 1_250_000_000, 1.0);
        assert_eq!(auto.choose(Some(1000), 12_288).codec, Codec::F16);
        // A slow (cold, cloud-paced) fetch does not hide the fast link seen just before.
        auto.observe(Duration::from_millis(1), 1_250_000, 1.0);
        assert_eq!(auto.choose(Some(1000), 12_288).codec, Codec::F16);
    }

    #[test]
    fn a_model_whose_small_codecs_miss_the_floor_stays_on_f16() {
        let auto = AutoCodec::new(table(), 0.999);
        auto.observe(Duration::from_millis(50), 1_250_000, 1.0);
        let c = auto.choose(None, 12_288);
        assert_eq!(c.codec, Codec::F16);
        assert!(c.reason.contains("int4 0.865"), "{}", c.reason);
    }
}
