//! Prometheus metrics of the edge server (`GET /metrics`).

use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: String,
    /// HTTP status.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `stop`, `length`, `cancelled`, `timeout` or `error`.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    /// Where a published cloud prompt's KV came from: `memory`, `disk`, `peer`, `cloud` or
    /// `local`; `private` for a private system message, held or computed alike (the count
    /// tells no tenant whether another's message was held).
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodecLabels {
    /// The KV codec `--codec auto` chose for a cloud fetch.
    pub codec: String,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub finished: Family<OutcomeLabels, Counter>,
    pub queue_depth: Gauge,
    pub active_sequences: Gauge,
    pub ttft_seconds: Histogram,
    pub token_seconds: Histogram,
    pub cloud_bytes: Counter,
    pub prefix_lookups: Family<SourceLabels, Counter>,
    pub private_kv_bytes: Gauge,
    pub shared_prefix_kv_bytes: Gauge,
    pub batch_rows: Histogram,
    pub kv_reserved_bytes: Gauge,
    pub prefix_cache_bytes: Gauge,
    pub prefix_cache_held_bytes: Gauge,
    pub private_cache_bytes: Gauge,
    pub resident_memory_bytes: Gauge,
    pub draining: Gauge,
    pub disk_write_errors: Counter,
    pub codec_choices: Family<CodecLabels, Counter>,
    pub link_bytes_per_second: Gauge,
    pub cold_prefills: Counter,
    pub prefix_matches: Counter,
    pub cold_layers_overlapped: Counter,
    pub cold_layers_run: Counter,
    pub cloud_layers_from: Gauge,
    pub trust_conflict: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("edgeprompt");
        let m = Self {
            requests: Family::default(),
            finished: Family::default(),
            queue_depth: Gauge::default(),
            active_sequences: Gauge::default(),
            ttft_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            token_seconds: Histogram::new(exponential_buckets(0.002, 2.0, 14)),
            cloud_bytes: Counter::default(),
            prefix_lookups: Family::default(),
            private_kv_bytes: Gauge::default(),
            shared_prefix_kv_bytes: Gauge::default(),
            batch_rows: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            kv_reserved_bytes: Gauge::default(),
            prefix_cache_bytes: Gauge::default(),
            prefix_cache_held_bytes: Gauge::default(),
            private_cache_bytes: Gauge::default(),
            resident_memory_bytes: Gauge::default(),
            draining: Gauge::default(),
            disk_write_errors: Counter::default(),
            codec_choices: Family::default(),
            link_bytes_per_second: Gauge::default(),
            cold_prefills: Counter::default(),
            prefix_matches: Counter::default(),
            cold_layers_overlapped: Counter::default(),
            cold_layers_run: Counter::default(),
            cloud_layers_from: Gauge::default(),
            trust_conflict: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "trust_conflict",
            "1 while the cloud shows another signing key than the pinned one (no cloud KV is used until an operator settles it)",
            m.trust_conflict.clone(),
        );
        registry.register(
            "cold_prefills",
            "Private prompts prefilled layer by layer while their cloud prompt streamed in",
            m.cold_prefills.clone(),
        );
        registry.register(
            "prompt_prefix_matches",
            "Completions whose prompt began with a cloud prompt held here, run on its KV",
            m.prefix_matches.clone(),
        );
        registry.register(
            "cold_layers_overlapped",
            "Private layers of cold prefills that ran before their cloud prompt's last layer landed",
            m.cold_layers_overlapped.clone(),
        );
        registry.register(
            "cold_layers_run",
            "Private layers run against a cloud prompt whose layers were still landing",
            m.cold_layers_run.clone(),
        );
        registry.register(
            "cloud_layers_from",
            "The first layer taken from the cloud in the last fetch; the layers below it were computed here (--cloud-layers-from auto)",
            m.cloud_layers_from.clone(),
        );
        registry.register(
            "codec_choices",
            "Cloud fetches by the KV codec --codec auto chose",
            m.codec_choices.clone(),
        );
        registry.register(
            "link_bytes_per_second",
            "The cloud link's throughput as --codec auto estimates it",
            m.link_bytes_per_second.clone(),
        );
        registry.register(
            "http_requests",
            "HTTP requests by endpoint and status",
            m.requests.clone(),
        );
        registry.register(
            "generations",
            "Finished generations by how they ended",
            m.finished.clone(),
        );
        registry.register(
            "queue_depth",
            "Admitted requests waiting for a batch slot",
            m.queue_depth.clone(),
        );
        registry.register(
            "active_sequences",
            "Sequences in the running batch",
            m.active_sequences.clone(),
        );
        registry.register(
            "ttft_seconds",
            "Time from admission to the first token",
            m.ttft_seconds.clone(),
        );
        registry.register(
            "token_latency_seconds",
            "Time between consecutive tokens of a sequence",
            m.token_seconds.clone(),
        );
        registry.register(
            "cloud_kv_bytes",
            "KV bytes received from the cloud",
            m.cloud_bytes.clone(),
        );
        registry.register(
            "prefix_lookups",
            "Cloud-prompt KV lookups by source (memory = cache hit)",
            m.prefix_lookups.clone(),
        );
        registry.register(
            "private_kv_bytes",
            "KV bytes private to running sequences",
            m.private_kv_bytes.clone(),
        );
        registry.register(
            "shared_prefix_kv_bytes",
            "KV bytes of cloud prompts used by running sequences, each counted once",
            m.shared_prefix_kv_bytes.clone(),
        );
        registry.register(
            "batch_rows",
            "Token rows per forward step",
            m.batch_rows.clone(),
        );
        registry.register(
            "kv_reserved_bytes",
            "Private KV bytes reserved by admitted requests (bounded by --kv-budget-mb)",
            m.kv_reserved_bytes.clone(),
        );
        registry.register(
            "prefix_cache_bytes",
            "Cloud-prompt KV bytes held in memory (bounded by --prefix-cache-mb plus what requests hold)",
            m.prefix_cache_bytes.clone(),
        );
        registry.register(
            "prefix_cache_held_bytes",
            "Of the cloud-prompt KV in memory, the bytes running or queued requests hold (not evictable now)",
            m.prefix_cache_held_bytes.clone(),
        );
        registry.register(
            "private_cache_bytes",
            "Finished conversations' KV kept for their next turns, all callers (bounded by --private-cache-mb)",
            m.private_cache_bytes.clone(),
        );
        registry.register(
            "resident_memory_bytes",
            "Resident memory of this process",
            m.resident_memory_bytes.clone(),
        );
        registry.register(
            "draining",
            "1 while the server drains before exiting",
            m.draining.clone(),
        );
        registry.register(
            "disk_cache_write_errors",
            "Cloud-prompt KV copies the disk tier could not store",
            m.disk_write_errors.clone(),
        );
        Self { registry, ..m }
    }

    pub fn request(&self, endpoint: &str, outcome: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    pub fn finished(&self, outcome: &str) {
        self.finished
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
    }

    pub fn lookup(&self, source: &str) {
        self.prefix_lookups
            .get_or_create(&SourceLabels {
                source: source.into(),
            })
            .inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
