//! `--cloud-layers-from auto`: the split for each cloud fetch, chosen by the planner
//! (`edgeprompt_planner::lslm`, CE-LSLM eq. 20) from the link this edge measures and its own
//! per-layer compute. A cloud running this edge's own model streams exact KV from any layer,
//! so every split is exact and only speed decides. A cloud mapping a larger model's KV
//! (CE-LSLM) is never asked below the split whose measured next-token agreement with the small
//! model alone reaches the floor (the quality run of `edgeprompt-bench lslm`,
//! `docs/results/lslm.json`). Which of the two the cloud is, its stream headers say.

use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use edgeprompt_engine::sequence::PrefillPass;
use edgeprompt_engine::Model;
use edgeprompt_planner::lslm::{plan, ttft, SplitInputs};

use crate::link_meter::{LinkEstimate, LinkMeter};
use crate::{EdgeError, Result};

/// Prompt length assumed when a fetch names the prompt by id (its length is not known yet).
const ASSUMED_TOKENS: usize = 1024;
/// Private prompt length the plan assumes unless configured (`with_private_tokens`). Never
/// the request's own: the first layer asked of the cloud would tell it that length.
pub const DEFAULT_PRIVATE_TOKENS: usize = 256;

#[derive(Debug, Clone, PartialEq)]
pub struct SplitChoice {
    /// Layers `split..` come from the cloud; `n_layer` means all are computed here.
    pub split: usize,
    pub reason: String,
}

/// What the cloud's layers are for this edge's model, as its last stream header said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudKv {
    /// No header seen yet.
    Unknown,
    /// This model's own KV: every split gives the same bits.
    Exact,
    /// A larger model's KV mapped through adapters (CE-LSLM).
    Mapped,
}

#[derive(Debug)]
pub struct AutoSplit {
    /// The lowest split the CE-LSLM quality floor allows, for a cloud that maps.
    lslm_floor: usize,
    /// `CloudKv` as a number (0 unknown, 1 exact, 2 mapped).
    cloud_kv: AtomicU8,
    n_layer: usize,
    /// Edge compute per prompt token per layer, seconds.
    token_layer_secs: f64,
    /// Per layer, its wire bytes per prompt token (f16 KV of the edge model's shape) and its
    /// fixed bytes (a recurrent layer: its state, whatever the prompt's length).
    layer_bytes: Vec<(usize, usize)>,
    /// The private prompt length the split is planned for.
    private_tokens: usize,
    meter: LinkMeter,
}

impl AutoSplit {
    /// `lslm_floor`: the lowest split a cloud that maps a larger model's KV may be asked for
    /// (`floor_from_table`); 0 for an edge that only talks to clouds running its own model.
    pub fn new(model: &Model, lslm_floor: usize, token_layer_secs: f64) -> Self {
        let c = &model.cfg;
        Self {
            lslm_floor: lslm_floor.min(c.n_layer),
            cloud_kv: AtomicU8::new(0),
            n_layer: c.n_layer,
            token_layer_secs,
            layer_bytes: (0..c.n_layer)
                .map(|l| match (c.is_recurrent(l), c.features.recurrence) {
                    (true, Some(s)) => (0, s.state_bytes()),
                    _ => (c.n_kv_head * c.head_dim * 2 * 2, 0),
                })
                .collect(),
            private_tokens: DEFAULT_PRIVATE_TOKENS,
            meter: LinkMeter::default(),
        }
    }

    /// Plan for private prompts of `n` tokens: a longer one hides more of the stream behind
    /// its own prefill and moves the split down.
    pub fn with_private_tokens(mut self, n: usize) -> Self {
        self.private_tokens = n;
        self
    }

    /// The lowest split whose agreement with the edge model alone, and every deeper split's,
    /// reaches `min_agreement` in the quality run of the table at `path` (rows for the edge
    /// model `slm`, its GGUF `general.name`); `n_layer` (load nothing) when none does.
    pub fn floor_from_table(
        path: &Path,
        slm: &str,
        n_layer: usize,
        min_agreement: f64,
    ) -> Result<usize> {
        let err = |e: String| EdgeError::Config(format!("CE-LSLM table {}: {e}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
        if v["slm"].as_str() != Some(slm) {
            return Err(err(format!(
                "measured for edge model {}, not {slm:?}",
                v["slm"]
            )));
        }
        let adapters = v["adapters"][0].as_str().unwrap_or_default();
        let mut splits: Vec<(usize, f64)> = v["quality"]["configs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["adapters"].as_str() == Some(adapters) && c["single_layer"].is_null())
            .filter_map(|c| Some((c["split"].as_u64()? as usize, c["agree_slm"].as_f64()?)))
            .collect();
        if splits.is_empty() {
            return Err(err("no quality rows with adapters".into()));
        }
        splits.sort_by_key(|s| std::cmp::Reverse(s.0));
        Ok(splits
            .iter()
            .take_while(|(_, agree)| *agree >= min_agreement)
            .last()
            .map_or(n_layer, |s| s.0))
    }

    /// This machine's prefill cost per token per layer: one 128-token pass, timed.
    pub fn measure(model: &Model) -> Result<f64> {
        let ids: Vec<u32> = (0..128u32).map(|i| 100 + i * 7).collect();
        let mut pass = PrefillPass::new(model, &ids, 0)?;
        let t = Instant::now();
        for _ in 0..model.cfg.n_layer {
            pass.run_layer(model, None)?;
        }
        Ok(t.elapsed().as_secs_f64() / (ids.len() * model.cfg.n_layer) as f64)
    }

    /// What the cloud streamed last time.
    pub fn cloud_kv(&self) -> CloudKv {
        match self.cloud_kv.load(Ordering::Acquire) {
            1 => CloudKv::Exact,
            2 => CloudKv::Mapped,
            _ => CloudKv::Unknown,
        }
    }

    /// A stream header said whether its layers are mapped (CE-LSLM) or this model's own.
    pub fn learn(&self, mapped: bool) {
        self.cloud_kv
            .store(if mapped { 2 } else { 1 }, Ordering::Release);
    }

    /// Whether the cloud's layers may be mapped (CE-LSLM) rather than exact: as its last
    /// header said; before any, whether a CE-LSLM floor was configured for this model.
    pub fn may_map(&self) -> bool {
        match self.cloud_kv() {
            CloudKv::Exact => false,
            CloudKv::Mapped => true,
            CloudKv::Unknown => self.lslm_floor > 0,
        }
    }

    /// The lowest split allowed now: 0 once the cloud has shown it streams this model's own
    /// KV; the CE-LSLM floor until then.
    pub fn min_split(&self) -> usize {
        match self.cloud_kv() {
            CloudKv::Exact => 0,
            CloudKv::Unknown | CloudKv::Mapped => self.lslm_floor,
        }
    }

    pub fn link(&self) -> Option<LinkEstimate> {
        self.meter.link()
    }

    pub fn observe(&self, rtt: Duration, bytes: usize, secs: f64) {
        self.meter.observe(rtt, bytes, secs)
    }

    /// The split for a cloud prompt of `tokens` (None: named by id, length unknown).
    pub fn choose(&self, tokens: Option<usize>) -> SplitChoice {
        let n = self.n_layer;
        let min_split = self.min_split();
        let Some(link) = self.link() else {
            return SplitChoice {
                split: min_split,
                reason: format!(
                    "no link measured yet: loading every layer allowed ({min_split}..), this fetch measures it"
                ),
            };
        };
        let p = tokens.unwrap_or(ASSUMED_TOKENS);
        let x = SplitInputs {
            prompt_layer_secs: vec![p as f64 * self.token_layer_secs; n],
            private_layer_secs: vec![self.private_tokens as f64 * self.token_layer_secs; n],
            layer_bytes: self
                .layer_bytes
                .iter()
                .map(|&(per_token, fixed)| p * per_token + fixed)
                .collect(),
            bandwidth_bps: link.bytes_per_sec * 8.0,
            rtt_secs: link.rtt.as_secs_f64(),
            cloud_secs: 0.0,
            head_secs: 0.0,
            min_split,
        };
        let best = plan(&x);
        SplitChoice {
            split: best.split,
            reason: format!(
                "link {:.0} Mbit/s, RTT {:.0} ms; {p} tokens: layers {}.. from the cloud, predicted {:.3} s (all here {:.3} s; floor {min_split}, cloud KV {:?})",
                link.bytes_per_sec * 8.0 / 1e6,
                link.rtt.as_secs_f64() * 1e3,
                best.split,
                best.ttft_secs,
                ttft(&x, n),
                self.cloud_kv()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auto(min_split: usize) -> AutoSplit {
        AutoSplit {
            lslm_floor: min_split,
            cloud_kv: AtomicU8::new(0),
            n_layer: 24,
            // 0.5B-like: ~200 tok/s prefill = 0.2 ms per token per layer.
            token_layer_secs: 0.2e-3,
            layer_bytes: vec![(512, 0); 24],
            private_tokens: 128,
            meter: LinkMeter::default(),
        }
    }

    #[test]
    fn the_split_follows_the_link_and_never_crosses_the_floor() {
        let a = auto(18);
        // Nothing measured: load what the floor allows, and measure.
        assert_eq!(a.choose(Some(1000)).split, 18);
        // 1 Gbit/s: a layer of 1000 tokens (0.5 MB) takes 4 ms vs 200 ms to compute: load.
        a.observe(Duration::from_millis(10), 125_000_000, 1.0);
        let fast = a.choose(Some(1000));
        assert_eq!(fast.split, 18, "{}", fast.reason);
        assert!(fast.reason.contains("1000 Mbit/s"), "{}", fast.reason);
        // 100 kbit/s: 41 s per layer; computing every layer here is faster.
        let slow = auto(18);
        slow.observe(Duration::from_millis(50), 1_250_000, 100.0);
        assert_eq!(slow.choose(Some(1000)).split, 24);
        // Between: at 10 Mbit/s a layer loads in 0.41 s and computes in 0.2 s, so the
        // fastest plan loads the deep layers while computing the shallow ones (~16..).
        let mid = auto(0);
        mid.observe(Duration::from_millis(20), 1_250_000, 1.0);
        let c = mid.choose(Some(1000));
        assert!(c.split > 8 && c.split < 24, "{}", c.reason);
    }

    #[test]
    fn a_cloud_streaming_this_models_own_kv_lifts_the_floor() {
        assert!(!auto(0).may_map(), "no CE-LSLM floor: exact KV expected");
        let a = auto(18);
        assert_eq!(a.cloud_kv(), CloudKv::Unknown);
        assert!(a.may_map());
        assert_eq!(a.choose(None).split, 18, "unknown: the CE-LSLM floor holds");
        a.learn(true);
        assert_eq!(a.choose(None).split, 18);
        a.learn(false);
        assert_eq!(a.cloud_kv(), CloudKv::Exact);
        assert!(!a.may_map());
        assert_eq!(a.choose(None).split, 0, "exact: every split allowed");
        // On a 10 Mbit/s link the exact split sits below the old floor.
        a.observe(Duration::from_millis(20), 1_250_000, 1.0);
        let c = a.choose(Some(1000));
        assert!(c.split > 8 && c.split < 18, "{}", c.reason);
    }

    #[test]
    fn a_longer_private_prompt_hides_more_of_the_stream() {
        let plan = |private| {
            let a = auto(0).with_private_tokens(private);
            a.observe(Duration::from_millis(20), 1_250_000, 1.0);
            a.choose(Some(1000))
        };
        let (short, long) = (plan(16), plan(1024));
        assert!(
            long.split < short.split,
            "{} vs {}",
            long.reason,
            short.reason
        );
    }

    #[test]
    fn the_floor_comes_from_the_quality_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lslm.json");
        let row = |split: Option<usize>,
                   single: Option<usize>,
                   agree: f64,
                   adapters: Option<&str>| {
            serde_json::json!({"split": split, "single_layer": single, "agree_slm": agree, "adapters": adapters})
        };
        let a = Some("a.safetensors");
        let v = serde_json::json!({
            "slm": "small", "adapters": ["a.safetensors"],
            "quality": {"configs": [
                row(Some(24), None, 1.0, None),
                row(Some(23), None, 0.98, a), row(Some(20), None, 0.94, a),
                row(Some(18), None, 0.89, a), row(Some(12), None, 0.95, a),
                row(None, Some(3), 0.5, a), row(Some(16), None, 0.99, None),
            ]}
        });
        std::fs::write(&path, v.to_string()).unwrap();
        let floor = |m| AutoSplit::floor_from_table(&path, "small", 24, m).unwrap();
        // 18 misses 0.9, so 12 (deeper than a miss) is not reached either.
        assert_eq!(floor(0.9), 20);
        assert_eq!(floor(0.85), 12);
        assert_eq!(floor(0.99), 24, "no split passes: load nothing");
        assert!(AutoSplit::floor_from_table(&path, "other", 24, 0.9).is_err());
    }
}
