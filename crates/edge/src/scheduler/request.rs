//! What a request brings to the scheduler and what comes back: the job, its extras, the
//! events of its answer, and why it was refused or ended unfinished.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeprompt_engine::{Constraint, ContinuedKv, PrefixKv, SamplingParams, TokenLogprobs};
use tokio::sync::mpsc;

use crate::layer_stream::LayerStream;
use crate::pipeline::Timeline;
use crate::private_cache::Hit;

/// One generation request: the private prompt after an optional shared prefix.
pub struct Job {
    pub prefix: Option<Arc<PrefixKv>>,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Where the answer goes; dropping the receiver cancels the request.
    pub events: mpsc::UnboundedSender<Event>,
}

/// What a request may ask or bring beyond its tokens.
#[derive(Default)]
pub struct Extras {
    /// A cloud prompt still arriving (then `Job::prefix` is `None`): the private prompt is
    /// prefilled layer by layer inside the running batch as the prompt's layers land.
    pub cold: Option<Arc<LayerStream>>,
    /// Log-probabilities of every sampled token and of this many alternatives each.
    pub logprobs: Option<usize>,
    /// The prompt is answered too (completions' `echo`): with `logprobs`, each of its tokens
    /// scored; `max_tokens` may then be 0.
    pub echo: bool,
    /// Further answers to the same prompt, each on its own channel: the prompt is prefilled
    /// once, then answer `k` (1, 2, ...) samples on its own with seed `seed + k`.
    pub forks: Vec<mpsc::UnboundedSender<Event>>,
    /// The grammar every answer must match (each answer has its own copy).
    pub constraint: Option<Constraint>,
    /// Given the first answer's whole KV (prefix, prompt and answer) when it ends well.
    pub keep: Option<Keep>,
    /// The conversation's earlier turns (the private prefix cache): the prompt continues the
    /// positions it shares with them, after their prefix, which is then `Job::prefix` too.
    pub kept: Option<Hit>,
    /// Who sent it (its connection's peer address), for fair shares of the batch.
    pub client: Option<std::net::IpAddr>,
}

/// Where a finished conversation's KV goes (the private prefix cache).
pub type Keep = Box<dyn FnOnce(ContinuedKv) + Send>;

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Text that became final.
    Text(String),
    Done(Done),
    Failed(Failure),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    /// `stop` (end of turn or a stop string) or `length`.
    pub finish_reason: &'static str,
    /// Prefix plus private prompt tokens.
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub token_ids: Vec<u32>,
    /// One per token id when the request asked for log-probabilities.
    pub logprobs: Vec<TokenLogprobs>,
    /// One per private prompt token when the request asked to score the prompt; `None` where
    /// nothing comes before the token (the first, without a cloud prompt).
    pub prompt_logprobs: Vec<Option<TokenLogprobs>>,
    /// For a request on a cold cloud prompt: when each layer landed and when this request's
    /// private layer ran (seconds since admission).
    pub timeline: Option<Timeline>,
    pub served: Served,
}

/// When a request was admitted and when its first token was drawn. Not part of the answer:
/// two answers are equal whenever they were served.
#[derive(Debug, Clone, Copy)]
pub struct Served {
    pub admitted: Instant,
    pub first_token: Option<Instant>,
}

impl PartialEq for Served {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Why an admitted request ended unfinished (`Event::Failed`): the kind, which the HTTP
/// layer maps to a status, and the words the client reads (they never quote a prompt).
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub kind: FailureKind,
    message: Cow<'static, str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The edge shut down before the answer was complete (retry on another).
    Stopped,
    /// The scheduler stopped for good after faults it could not contain.
    Dead,
    /// A cold cloud prompt had to be computed here and there was no room for it now.
    Busy,
    /// A cold cloud prompt could not be had.
    NoCloudPrompt,
    /// The request's time ran out.
    TimedOut,
    /// A fault in this edge (a contained panic, an engine error).
    Internal,
}

impl Failure {
    fn new(kind: FailureKind, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// A step that panicked or an engine error; the error's own text stays in the log when it
    /// may quote a prompt ([`FAULT`]).
    pub fn internal(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(FailureKind::Internal, message)
    }

    /// The scheduler is dead; `why` starts with [`DEAD`].
    pub fn dead(why: String) -> Self {
        Self::new(FailureKind::Dead, why)
    }

    pub fn busy(why: impl std::fmt::Display) -> Self {
        Self::new(FailureKind::Busy, format!("{BUSY}: {why}"))
    }

    pub fn no_cloud_prompt(why: impl std::fmt::Display) -> Self {
        Self::new(
            FailureKind::NoCloudPrompt,
            format!("{NO_CLOUD_PROMPT}: {why}"),
        )
    }

    pub fn timed_out(after: Duration) -> Self {
        Self::new(
            FailureKind::TimedOut,
            format!("request timed out after {} s", after.as_secs_f64()),
        )
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The words, as text.
impl std::ops::Deref for Failure {
    type Target = str;
    fn deref(&self) -> &str {
        &self.message
    }
}

/// Why a request ended unfinished when the server stopped (`Event::Failed`).
pub const STOPPED: Failure = Failure {
    kind: FailureKind::Stopped,
    message: Cow::Borrowed("the edge shut down before this answer was complete"),
};

/// Why a request in a step that panicked ended (`Event::Failed`). The panic's own message
/// stays in the server's log: it may quote a prompt.
pub const FAULT: &str = "an internal fault in the edge ended this request; retry it";

/// How the reason starts when a cold cloud prompt could not be had.
const NO_CLOUD_PROMPT: &str = "could not get the cloud prompt";

/// How the reason starts when a cold cloud prompt had to be computed here and there was no
/// room for it now.
const BUSY: &str = "this edge is busy";

/// How the reason starts once the scheduler has stopped for good (`Scheduler::dead`).
pub const DEAD: &str = "the edge's scheduler stopped";

/// This many panics within `FAULT_WINDOW` and the scheduler stops: a fault that keeps coming
/// back is not contained, and an orchestrator should restart the process.
pub const FAULTS_TO_DIE: usize = 3;
pub const FAULT_WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The request can never run here (HTTP 400).
    Invalid(String),
    /// The KV budget or the queue is full; try again later (HTTP 429).
    Full {
        retry_after_secs: u64,
        reason: &'static str,
    },
    /// The scheduler is gone.
    Stopped,
    /// The scheduler stopped after faults it could not contain; the reason.
    Dead(String),
}

/// KV bytes held by the running sequences, counted by walking their buffers: a prefix layer
/// shared by many sequences is one buffer and counted once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvUsage {
    pub sequences: usize,
    pub private_bytes: usize,
    pub shared_prefix_bytes: usize,
    pub distinct_prefix_buffers: usize,
}
