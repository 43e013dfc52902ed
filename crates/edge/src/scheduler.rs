//! Continuous batching on the edge: requests join the running batch at step boundaries, every
//! step is one forward pass over the weights for all active sequences (decoding ones feed one
//! token, prefilling ones a chunk of their prompt), and sequences on the same cloud prompt
//! share one read-only copy of its KV, attended for the whole batch at once.
//!
//! Because the engine's kernels are batch-invariant, a request's tokens do not depend on what
//! else is in the batch: batched answers equal answers computed alone, bit for bit.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use edgeprompt_engine::sequence::PrefillPass;
use edgeprompt_engine::{
    draw, logprobs, sample_each, Constraint, ContinuedKv, Draw, Model, PrefixKv, Sampler,
    SamplingParams, Sequence, TextStream, TokenLogprobs,
};
use tokio::sync::{mpsc, watch};

use crate::layer_stream::LayerStream;
use crate::metrics::Metrics;
use crate::pipeline::{LayerTiming, Timeline};
use crate::private_cache::Hit;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most sequences in one batch; more wait in the queue.
    pub max_batch: usize,
    /// Prompt tokens prefilled per step, across sequences (chunked prefill: a long prompt
    /// cannot stall the decoding sequences for more than one chunk).
    pub prefill_chunk: usize,
    /// Bytes of private KV the admitted requests may reserve (prompt + max_tokens each).
    pub kv_budget_bytes: usize,
    /// Bytes of finished conversations' KV kept for their next turns (the private prefix
    /// cache, per tenant); 0 keeps none.
    pub private_cache_bytes: usize,
    /// Admitted requests waiting for a batch slot beyond `max_batch`; more get 429.
    pub max_queue: usize,
    pub request_timeout: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_batch: 32,
            prefill_chunk: 256,
            kv_budget_bytes: 1 << 30,
            private_cache_bytes: 256 << 20,
            max_queue: 256,
            request_timeout: Duration::from_secs(300),
        }
    }
}

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
    Failed(String),
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

/// Why a request ended unfinished when the server stopped (`Event::Failed`).
pub const STOPPED: &str = "the edge shut down before this answer was complete";

/// Why a request in a step that panicked ended (`Event::Failed`). The panic's own message
/// stays in the server's log: it may quote a prompt.
pub const FAULT: &str = "an internal fault in the edge ended this request; retry it";

/// How the reason starts when a cold cloud prompt could not be had (`Event::Failed`; a bad
/// gateway to the client).
pub const NO_CLOUD_PROMPT: &str = "could not get the cloud prompt";

/// How the reason starts when a cold cloud prompt had to be computed here and there was no
/// room for it now (`Event::Failed`; too many requests, retry later).
pub const BUSY: &str = "this edge is busy";

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

/// What admitted requests hold: KV bytes reserved and how many they are.
#[derive(Default)]
struct Held {
    bytes: AtomicUsize,
    requests: AtomicUsize,
}

/// A request's share of the KV budget and its place in the admitted count, given back when
/// the request ends however it ends.
struct Reservation {
    held: Arc<Held>,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.held.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        self.held.requests.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Running {
    job: Job,
    seq: Sequence,
    fed: usize,
    next: Option<u32>,
    sampler: Sampler,
    constraint: Option<Constraint>,
    text: TextStream,
    admitted: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    logprobs: Option<usize>,
    token_logprobs: Vec<TokenLogprobs>,
    /// The prompt's scores so far (tokens 1.. in order; token 0 once the prompt is in), when
    /// asked for.
    prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    /// Answers still to fork off once the prompt is in, each with its reservation.
    forks: Vec<(mpsc::UnboundedSender<Event>, Reservation)>,
    /// The private prefill against a cloud prompt still streaming; `seq` is empty until done.
    cold: Option<Cold>,
    timeline: Option<Timeline>,
    keep: Option<Keep>,
    client: Option<std::net::IpAddr>,
    _reservation: Reservation,
}

/// A row's next token, or why its grammar could not give one.
type Drawn = Result<u32, edgeprompt_engine::GrammarError>;

/// A finished cold prefill: the sequence, its last-row logits, the prompt's row scores.
type Finished = (Sequence, Vec<f32>, Vec<TokenLogprobs>);

/// A private prompt prefilled one layer at a time as a cold cloud prompt's layers land.
struct Cold {
    stream: Arc<LayerStream>,
    pass: Option<PrefillPass>,
    rows: usize,
    timeline: Timeline,
}

impl Cold {
    /// Run the layers that have landed, each costing `rows / n_layer` of the step's prefill
    /// budget (one layer at least, so a cold prompt always moves). The sequence and its first
    /// logits once the last layer ran and the prompt is resolved.
    fn run(
        &mut self,
        model: &Model,
        budget: &mut usize,
        since: Instant,
        score: Option<(usize, &[u32])>,
    ) -> Result<Option<Finished>, String> {
        let Some(pass) = self.pass.as_mut() else {
            return Err("cold prefill already finished".into());
        };
        let n = model.cfg.n_layer;
        let cost = self.rows.div_ceil(n).max(1);
        let secs = |t: Instant| t.saturating_duration_since(since).as_secs_f64();
        let mut ran = 0;
        while pass.next_layer() < n && (ran == 0 || *budget >= cost) {
            let l = pass.next_layer();
            let Some(landed) = self.stream.layer(l) else {
                break;
            };
            let t0 = Instant::now();
            pass.run_layer(model, Some(&landed.kv))
                .map_err(|e| e.to_string())?;
            *budget = budget.saturating_sub(cost);
            ran += 1;
            self.timeline.layers.push(LayerTiming {
                layer: l,
                arrived: secs(landed.at),
                compute_start: secs(t0),
                compute_end: secs(Instant::now()),
                wire_bytes: landed.wire_bytes,
            });
        }
        match self.stream.outcome() {
            Some(Err(e)) if e.busy => Err(format!("{BUSY}: {e}")),
            Some(Err(e)) => Err(format!("{NO_CLOUD_PROMPT}: {e}")),
            Some(Ok(prefix)) if pass.next_layer() == n => {
                let pass = self.pass.take().ok_or("cold prefill already finished")?;
                let scores = match score {
                    Some((top, ids)) => {
                        let x = pass.hidden();
                        let rows = &x[..x.len() - model.cfg.n_embd];
                        model
                            .score_rows(rows, &ids[1..], top)
                            .map_err(|e| e.to_string())?
                    }
                    None => Vec::new(),
                };
                let (seq, logits) = pass.finish(model, prefix).map_err(|e| e.to_string())?;
                Ok(Some((seq, logits, scores)))
            }
            _ => Ok(None),
        }
    }

    /// Private layers that ran before the prompt's last layer landed.
    fn overlapped(&self) -> usize {
        let t = &self.timeline.layers;
        let last = t.iter().map(|l| l.arrived).fold(0.0, f64::max);
        t.iter().filter(|l| l.compute_start < last).count()
    }
}

impl Running {
    /// Alternatives per scored prompt row, while the prompt is still being scored.
    fn scoring(&self) -> Option<usize> {
        let asked = self.prompt_logprobs.is_some() && self.fed < self.job.prompt.len();
        asked.then(|| self.logprobs.unwrap_or(0))
    }

    /// Add a prefill step's prompt scores (`fed` already counts its rows): the rows' own, then
    /// the next token's from the last row's `logits`; once the prompt is in, its first token's
    /// from the cloud prompt's last row.
    fn score_prompt(
        &mut self,
        model: &Model,
        logits: &[f32],
        rows: Vec<TokenLogprobs>,
    ) -> Result<(), String> {
        let top = self.logprobs.unwrap_or(0);
        let prompt = &self.job.prompt;
        let Some(scores) = self.prompt_logprobs.as_mut() else {
            return Ok(());
        };
        scores.extend(rows.into_iter().map(Some));
        if let Some(&next) = prompt.get(self.fed) {
            scores.push(Some(logprobs(logits, next, top)));
            return Ok(());
        }
        let first = match self.seq.prefix() {
            Some(p) => model
                .prefix_logits(p)
                .map_err(|e| e.to_string())?
                .map(|l| logprobs(&l, prompt[0], top)),
            None => None,
        };
        scores.insert(0, first);
        Ok(())
    }

    /// The further answers, each a copy of this sequence (the prompt's KV) and its own sampler.
    fn fork(&mut self) -> Vec<Running> {
        let forks = std::mem::take(&mut self.forks);
        forks
            .into_iter()
            .enumerate()
            .map(|(k, (events, reservation))| {
                let mut sampling = self.job.sampling.clone();
                sampling.seed = sampling.seed.wrapping_add(k as u64 + 1);
                Running {
                    job: Job {
                        prefix: self.job.prefix.clone(),
                        prompt: self.job.prompt.clone(),
                        max_tokens: self.job.max_tokens,
                        sampling: sampling.clone(),
                        stop: self.job.stop.clone(),
                        events,
                    },
                    seq: self.seq.clone(),
                    fed: self.fed,
                    next: None,
                    sampler: Sampler::new(sampling),
                    constraint: self.constraint.as_ref().map(Constraint::fork),
                    text: TextStream::new(&self.job.stop),
                    admitted: self.admitted,
                    first_token: None,
                    last_token: None,
                    logprobs: self.logprobs,
                    token_logprobs: Vec::new(),
                    prompt_logprobs: self.prompt_logprobs.clone(),
                    forks: Vec::new(),
                    cold: None,
                    timeline: None,
                    keep: None,
                    client: self.client,
                    _reservation: reservation,
                }
            })
            .collect()
    }
}

/// The batch and its queue, stepped by the scheduler thread (or by hand in tests).
pub struct Batcher {
    model: Arc<Model>,
    cfg: SchedulerConfig,
    metrics: Arc<Metrics>,
    waiting: VecDeque<Running>,
    active: Vec<Running>,
    held: Arc<Held>,
    usage: Arc<Mutex<KvUsage>>,
    /// Set by `Scheduler::stop`: every request still here ends with this reason.
    stop: Arc<Mutex<Option<String>>>,
    /// Tests only: the next step that runs the model panics.
    inject: Arc<AtomicBool>,
}

impl Batcher {
    pub fn new(model: Arc<Model>, cfg: SchedulerConfig, metrics: Arc<Metrics>) -> Self {
        Self {
            model,
            cfg,
            metrics,
            waiting: VecDeque::new(),
            active: Vec::new(),
            held: Arc::new(Held::default()),
            usage: Arc::new(Mutex::new(KvUsage::default())),
            stop: Arc::new(Mutex::new(None)),
            inject: Arc::new(AtomicBool::new(false)),
        }
    }

    /// `step`, with a panic contained: the requests that were in the batch end with [`FAULT`]
    /// (their KV reservations given back); the queue and the batcher stay usable. `Err` says
    /// the step panicked.
    fn step_contained(&mut self) -> Result<usize, ()> {
        match catch_unwind(AssertUnwindSafe(|| self.step())) {
            Ok(rows) => Ok(rows),
            Err(payload) => {
                let what = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".into());
                tracing::error!(
                    requests = self.active.len(),
                    "a scheduler step panicked: {what}; its requests end with an error"
                );
                // The batch's sequences may be half-written: drop them all.
                self.usage.clear_poison();
                self.stop.clear_poison();
                self.fail_active(FAULT, "fault");
                Err(())
            }
        }
    }

    /// End every running request with `why`, counted under `outcome`.
    fn fail_active(&mut self, why: &str, outcome: &str) {
        for r in self.active.drain(..) {
            fail(r, why, outcome, &self.metrics);
        }
        self.publish();
    }

    /// End every running and queued request with `why`, counted under `outcome`.
    fn fail_all(&mut self, why: &str, outcome: &str) {
        for r in self.waiting.drain(..) {
            fail(r, why, outcome, &self.metrics);
        }
        self.fail_active(why, outcome);
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.active.is_empty()
    }

    /// Whether a running request waits for a cold cloud prompt's next layer.
    pub fn waits_for_layers(&self) -> bool {
        self.active.iter().any(|r| r.cold.is_some())
    }

    /// `admit` with extras (a cold cloud prompt, log-probabilities, further answers).
    pub fn admit_with(&mut self, job: Job, extras: Extras) -> Result<(), Refusal> {
        let r = admission(&self.model, &self.cfg, &self.held, job, extras)?;
        self.waiting.push_back(r);
        self.metrics.queue_depth.set(self.waiting.len() as i64);
        Ok(())
    }

    pub fn usage(&self) -> KvUsage {
        self.usage.lock().map(|u| *u).unwrap_or_default()
    }

    /// Fill the batch's free slots fairly between clients: each slot to the waiting request
    /// of the client holding the fewest (queue order among equals, so one client alone is
    /// served first come, first served). When the batch is full and a client that holds no
    /// slot waits, one answer being decoded for the client holding the most (two at least)
    /// steps back to the queue for it, its KV kept: it resumes where it stopped, with the
    /// same bits, since a sequence's tokens do not depend on its batch. So no client's
    /// requests, however many or however long, hold the batch against another's.
    fn fill(&mut self) {
        let held = |active: &[Running], c: Option<std::net::IpAddr>| {
            active.iter().filter(|r| r.client == c).count()
        };
        if self.active.len() >= self.cfg.max_batch
            && self
                .waiting
                .iter()
                .any(|w| held(&self.active, w.client) == 0)
        {
            let most = self
                .active
                .iter()
                .map(|r| (held(&self.active, r.client), r.client))
                .max_by_key(|(n, _)| *n);
            if let Some((n, c)) = most.filter(|(n, _)| *n >= 2) {
                let _ = n;
                let decoding = self.active.iter().rposition(|r| {
                    r.client == c
                        && r.cold.is_none()
                        && r.forks.is_empty()
                        && r.fed >= r.job.prompt.len()
                        && r.next.is_some()
                });
                if let Some(i) = decoding {
                    let r = self.active.remove(i);
                    self.waiting.push_back(r);
                }
            }
        }
        while self.active.len() < self.cfg.max_batch && !self.waiting.is_empty() {
            let pick = (0..self.waiting.len())
                .min_by_key(|&i| (held(&self.active, self.waiting[i].client), i))
                .unwrap_or(0);
            match self.waiting.remove(pick) {
                Some(r) => self.active.push(r),
                None => break,
            }
        }
    }

    /// Check a job and reserve its KV; the job then waits for a batch slot.
    pub fn admit(&mut self, job: Job) -> Result<(), Refusal> {
        self.admit_with(job, Extras::default())
    }

    /// One forward pass for the whole batch, after the private layers of cold prompts whose
    /// cloud layers have landed. Returns the token rows of the forward pass.
    pub fn step(&mut self) -> usize {
        self.reap();
        self.fill();
        let mut budget = self.cfg.prefill_chunk.max(1);
        self.run_cold(&mut budget);
        let mut feeds: Vec<Option<Vec<u32>>> = Vec::with_capacity(self.active.len());
        for r in &self.active {
            let feed = if r.cold.is_some() {
                None
            } else if r.fed < r.job.prompt.len() {
                let n = budget.min(r.job.prompt.len() - r.fed);
                budget -= n;
                (n > 0).then(|| r.job.prompt[r.fed..r.fed + n].to_vec())
            } else {
                r.next.map(|id| vec![id])
            };
            feeds.push(feed);
        }
        let rows: usize = feeds.iter().flatten().map(|f| f.len()).sum();
        if rows == 0 {
            self.publish();
            return 0;
        }
        let score: Vec<Option<usize>> = self
            .active
            .iter()
            .zip(&feeds)
            .filter(|(_, f)| f.is_some())
            .map(|(r, _)| r.scoring())
            .collect();
        let mut batch: Vec<(&mut Sequence, &[u32])> = self
            .active
            .iter_mut()
            .zip(&feeds)
            .filter_map(|(r, f)| f.as_deref().map(|f| (&mut r.seq, f)))
            .collect();
        let result = self.model.forward_scoring(&mut batch, &score);
        drop(batch);
        if self.inject.swap(false, Ordering::AcqRel) {
            panic!("injected fault: a test asked this step to panic");
        }
        self.metrics.batch_rows.observe(rows as f64);
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                // Nothing was appended (the engine checks before writing); fail the batch's
                // requests rather than the server.
                for (r, f) in self.active.iter().zip(&feeds) {
                    if f.is_some() {
                        let _ = r.job.events.send(Event::Failed(e.to_string()));
                        self.metrics.finished("error");
                    }
                }
                let mut i = 0;
                self.active.retain(|_| {
                    i += 1;
                    feeds[i - 1].is_none()
                });
                self.publish();
                return 0;
            }
        };
        // Decoding sequences draw their next tokens together, over the engine's pool.
        let mut drawn: Vec<Option<Drawn>> = (0..self.active.len()).map(|_| None).collect();
        {
            let (mut draws, mut at) = (Vec::new(), Vec::new());
            let mut step_logits = logits.iter();
            for (i, (r, f)) in self.active.iter_mut().zip(&feeds).enumerate() {
                if f.is_none() {
                    continue;
                }
                let Some((l, _)) = step_logits.next() else {
                    break;
                };
                if r.fed >= r.job.prompt.len() && r.job.max_tokens > 0 {
                    at.push(i);
                    draws.push(Draw {
                        sampler: &mut r.sampler,
                        constraint: r.constraint.as_mut(),
                        logits: &l[..],
                    });
                }
            }
            for (i, id) in at.into_iter().zip(sample_each(draws)) {
                drawn[i] = Some(id);
            }
        }
        let mut logits = logits.into_iter();
        let mut ended = vec![false; self.active.len()];
        for (i, f) in feeds.iter().enumerate() {
            let Some(f) = f else { continue };
            let (l, scores) = logits.next().unwrap_or_default();
            ended[i] = self.advance(i, f.len(), &l, scores, drawn[i].take());
        }
        let mut i = 0;
        self.active.retain(|_| {
            i += 1;
            !ended[i - 1]
        });
        self.publish();
        rows
    }

    /// Advance the cold prompts' private prefills by the layers that have landed; a finished
    /// one samples its first token here and decodes with the batch from this step on.
    fn run_cold(&mut self, budget: &mut usize) {
        let mut outcomes = Vec::new();
        for (i, r) in self.active.iter_mut().enumerate() {
            let score = r.scoring().map(|top| (top, &r.job.prompt[..]));
            let Some(c) = r.cold.as_mut() else { continue };
            let before = c.timeline.layers.len();
            let ran = c.run(&self.model, budget, r.admitted, score);
            self.metrics
                .cold_layers_run
                .inc_by((c.timeline.layers.len() - before) as u64);
            match ran {
                Ok(None) => {}
                Ok(Some((seq, logits, scores))) => {
                    self.metrics.cold_prefills.inc();
                    self.metrics
                        .cold_layers_overlapped
                        .inc_by(c.overlapped() as u64);
                    r.timeline = Some(std::mem::take(&mut c.timeline));
                    r.cold = None;
                    r.seq = seq;
                    outcomes.push((i, Ok((logits, scores))));
                }
                Err(e) => outcomes.push((i, Err(e))),
            }
        }
        let mut ended = vec![false; self.active.len()];
        for (i, o) in outcomes {
            ended[i] = match o {
                Ok((logits, scores)) => {
                    let rows = self.active[i].job.prompt.len();
                    self.advance(i, rows, &logits, scores, None)
                }
                Err(e) => {
                    let _ = self.active[i].job.events.send(Event::Failed(e));
                    self.metrics.finished("error");
                    true
                }
            };
        }
        let mut i = 0;
        self.active.retain(|_| {
            i += 1;
            !ended[i - 1]
        });
    }

    /// Take one step's logits (and the prompt rows' scores, when asked) for active sequence
    /// `i`, with its next token when it was `drawn` already; true when its answer is over.
    fn advance(
        &mut self,
        i: usize,
        fed: usize,
        logits: &[f32],
        scores: Vec<TokenLogprobs>,
        drawn: Option<Drawn>,
    ) -> bool {
        let r = &mut self.active[i];
        if r.fed < r.job.prompt.len() {
            r.fed += fed;
            if let Err(e) = r.score_prompt(&self.model, logits, scores) {
                let _ = r.job.events.send(Event::Failed(e));
                self.metrics.finished("error");
                return true;
            }
            if r.fed < r.job.prompt.len() {
                return false;
            }
            // The prompt is in: further answers start here, from the same KV and logits, and
            // wait at the head of the queue for batch slots (max_batch holds).
            for mut f in r.fork().into_iter().rev() {
                if !emit(&mut f, logits, None, &self.model, &self.metrics) {
                    self.waiting.push_front(f);
                }
            }
        }
        emit(
            &mut self.active[i],
            logits,
            drawn,
            &self.model,
            &self.metrics,
        )
    }

    /// Drop requests whose client went away or whose time is up (or all, once stopped).
    fn reap(&mut self) {
        let timeout = self.cfg.request_timeout;
        let stop = self.stop.lock().ok().and_then(|s| s.clone());
        let mut outcomes = Vec::new();
        let keep = |r: &Running, outcomes: &mut Vec<&'static str>| {
            if r.job.events.is_closed() {
                outcomes.push("cancelled");
                false
            } else if let Some(why) = &stop {
                let _ = r.job.events.send(Event::Failed(why.clone()));
                outcomes.push("shutdown");
                false
            } else if r.admitted.elapsed() > timeout {
                let _ = r.job.events.send(Event::Failed(format!(
                    "request timed out after {} s",
                    timeout.as_secs_f64()
                )));
                outcomes.push("timeout");
                false
            } else {
                true
            }
        };
        self.active.retain(|r| keep(r, &mut outcomes));
        self.waiting.retain(|r| keep(r, &mut outcomes));
        for o in outcomes {
            self.metrics.finished(o);
        }
    }

    /// Update the usage snapshot and gauges.
    fn publish(&self) {
        let mut seen = HashSet::new();
        let mut u = KvUsage {
            sequences: self.active.len(),
            ..KvUsage::default()
        };
        for r in &self.active {
            u.private_bytes += r.seq.private_kv_bytes();
            let kept = r.seq.kept().map(|k| &k.layers);
            for l in r
                .seq
                .prefix()
                .map(|p| &p.layers)
                .into_iter()
                .chain(kept)
                .flatten()
            {
                if seen.insert(Arc::as_ptr(l)) {
                    u.shared_prefix_bytes += l.bytes();
                    u.distinct_prefix_buffers += 1;
                }
            }
        }
        if let Ok(mut g) = self.usage.lock() {
            *g = u;
        }
        let m = &self.metrics;
        m.queue_depth.set(self.waiting.len() as i64);
        m.active_sequences.set(self.active.len() as i64);
        m.private_kv_bytes.set(u.private_bytes as i64);
        m.shared_prefix_kv_bytes.set(u.shared_prefix_bytes as i64);
    }
}

/// Sample `r`'s next token from `logits` (or take the one `drawn` from them) and send what it
/// makes final; true when the answer is over.
fn emit(
    r: &mut Running,
    logits: &[f32],
    drawn: Option<Drawn>,
    model: &Model,
    metrics: &Metrics,
) -> bool {
    if r.job.max_tokens == 0 {
        // Only the prompt was asked for (scored).
        finish(r, "length", metrics);
        return true;
    }
    let drawn = drawn.unwrap_or_else(|| draw(&mut r.sampler, r.constraint.as_mut(), logits));
    let id = match drawn {
        Ok(id) => id,
        Err(e) => {
            let _ = r.job.events.send(Event::Failed(e.to_string()));
            metrics.finished("error");
            return true;
        }
    };
    if let Some(top) = r.logprobs {
        r.token_logprobs.push(logprobs(logits, id, top));
    }

    let now = Instant::now();
    match r.last_token {
        None => {
            r.first_token = Some(now);
            metrics
                .ttft_seconds
                .observe((now - r.admitted).as_secs_f64())
        }
        Some(t) => metrics.token_seconds.observe((now - t).as_secs_f64()),
    }
    r.last_token = Some(now);
    let (delta, stopped) = match r.text.push(&model.tokenizer, id) {
        Ok(x) => x,
        Err(e) => {
            let _ = r.job.events.send(Event::Failed(e.to_string()));
            metrics.finished("error");
            return true;
        }
    };
    if !delta.is_empty() {
        let _ = r.job.events.send(Event::Text(delta));
    }
    let full = r.text.ids().len() >= r.job.max_tokens;
    if stopped || full {
        let rest = r.text.finish();
        if !rest.is_empty() {
            let _ = r.job.events.send(Event::Text(rest));
        }
        // Kept before the answer is said done: the next turn may come at once.
        if let Some(keep) = r.keep.take() {
            if let Ok(kv) = r.seq.export_continued(model) {
                keep(kv);
            }
        }
        finish(r, if stopped { "stop" } else { "length" }, metrics);
        return true;
    }
    r.next = Some(id);
    false
}

/// End `r` unfinished with `why`, and its forks still waiting to start.
fn fail(r: Running, why: &str, outcome: &str, metrics: &Metrics) {
    let _ = r.job.events.send(Event::Failed(why.to_string()));
    for (f, _) in &r.forks {
        let _ = f.send(Event::Failed(why.to_string()));
    }
    metrics.finished(outcome);
}

fn finish(r: &mut Running, reason: &'static str, metrics: &Metrics) {
    let _ = r.job.events.send(Event::Done(Done {
        finish_reason: reason,
        prompt_tokens: r.seq.prefix_len() + r.job.prompt.len(),
        completion_tokens: r.text.ids().len(),
        token_ids: r.text.ids().to_vec(),
        logprobs: std::mem::take(&mut r.token_logprobs),
        prompt_logprobs: r.prompt_logprobs.take().unwrap_or_default(),
        timeline: r.timeline.clone(),
        served: Served {
            admitted: r.admitted,
            first_token: r.first_token,
        },
    }));
    metrics.finished(reason);
}

/// KV bytes one token takes in every attention layer.
pub fn kv_bytes_per_token(model: &Model) -> usize {
    model.cfg.kv_bytes_per_token()
}

fn admission(
    model: &Model,
    cfg: &SchedulerConfig,
    held: &Arc<Held>,
    mut job: Job,
    extras: Extras,
) -> Result<Running, Refusal> {
    let prefix_len = match (&job.prefix, &extras.cold) {
        (Some(_), Some(_)) => {
            return Err(Refusal::Invalid(
                "a job has one cloud prompt, whole or streaming".into(),
            ))
        }
        (Some(p), None) => p.n_tokens(),
        (None, Some(s)) => s.token_ids().len(),
        (None, None) => 0,
    };
    let prefix_len = match &extras.kept {
        None => prefix_len,
        Some(k) => {
            let same = match (&job.prefix, &k.kv.prefix) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            };
            // The prompt's first token is scored after the prefix alone (`score_prompt`).
            if !same || extras.cold.is_some() || extras.echo {
                return Err(Refusal::Invalid(
                    "kept turns go with their own prefix, not streamed or echoed".into(),
                ));
            }
            k.n_tokens()
        }
    };
    if job.prompt.is_empty() {
        return Err(Refusal::Invalid("the prompt has no tokens".into()));
    }
    let context = model.max_positions();
    let used = prefix_len + job.prompt.len();
    if used >= context {
        return Err(Refusal::Invalid(format!(
            "the prompt has {used} tokens ({prefix_len} of them the cloud prompt); this model's context is {context}"
        )));
    }
    // Zero new tokens is a request to score the prompt only.
    job.max_tokens = job.max_tokens.min(context - used);
    if job.max_tokens == 0 && !extras.echo {
        return Err(Refusal::Invalid(
            "max_tokens must be at least 1 (0 only with echo, to score the prompt)".into(),
        ));
    }
    let seq = match (&extras.kept, &job.prefix) {
        (Some(k), _) => Sequence::continuing_first(model, k.kv.clone(), k.len),
        (None, Some(p)) => Sequence::with_prefix(model, p.clone()),
        (None, None) => Ok(Sequence::new(model)),
    }
    .map_err(|e| Refusal::Invalid(e.to_string()))?;
    let cold = match extras.cold {
        Some(stream) => Some(Cold {
            pass: Some(
                PrefillPass::new(model, &job.prompt, prefix_len)
                    .map_err(|e| Refusal::Invalid(e.to_string()))?,
            ),
            rows: job.prompt.len(),
            stream,
            timeline: Timeline::default(),
        }),
        None => None,
    };
    // Every answer (n of them) holds its own copy of the private KV and a place in the queue.
    let answers = 1 + extras.forks.len();
    if answers > cfg.max_batch + cfg.max_queue {
        return Err(Refusal::Invalid(format!(
            "{answers} answers exceed this server's batch and queue ({})",
            cfg.max_batch + cfg.max_queue
        )));
    }
    // A hybrid model's answer also holds its own recurrent states.
    let bytes = model.cfg.prompt_bytes(job.prompt.len() + job.max_tokens);
    if bytes * answers > cfg.kv_budget_bytes {
        return Err(Refusal::Invalid(format!(
            "{answers} x (prompt + max_tokens) need {:.1} MB of private KV; this server's budget is {:.1} MB",
            (bytes * answers) as f64 / 1e6,
            cfg.kv_budget_bytes as f64 / 1e6
        )));
    }
    // Count the answers first so the queue bound holds under concurrent admissions; each
    // reservation gives its count (and, once set, its bytes) back when dropped.
    let ahead = held.requests.fetch_add(answers, Ordering::AcqRel);
    let mut reservations: Vec<Reservation> = (0..answers)
        .map(|_| Reservation {
            held: held.clone(),
            bytes: 0,
        })
        .collect();
    if ahead + answers > cfg.max_batch + cfg.max_queue {
        return Err(Refusal::Full {
            retry_after_secs: 1,
            reason: "the edge's request queue is full; retry later",
        });
    }
    let total = bytes * answers;
    let mut now = held.bytes.load(Ordering::Acquire);
    loop {
        if now + total > cfg.kv_budget_bytes {
            return Err(Refusal::Full {
                retry_after_secs: 1,
                reason: "the edge's KV budget is taken by running requests; retry later",
            });
        }
        match held
            .bytes
            .compare_exchange(now, now + total, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => break,
            Err(x) => now = x,
        }
    }
    for r in &mut reservations {
        r.bytes = bytes;
    }
    let mut reservations = reservations.into_iter();
    let reservation = reservations.next().expect("at least one answer");
    Ok(Running {
        sampler: Sampler::new(job.sampling.clone()),
        constraint: extras.constraint,
        text: TextStream::new(&job.stop),
        job,
        seq,
        fed: 0,
        next: None,
        admitted: Instant::now(),
        first_token: None,
        last_token: None,
        prompt_logprobs: (extras.echo && extras.logprobs.is_some()).then(Vec::new),
        logprobs: extras.logprobs,
        token_logprobs: Vec::new(),
        forks: extras.forks.into_iter().zip(reservations).collect(),
        cold,
        timeline: None,
        keep: extras.keep,
        client: extras.client,
        _reservation: reservation,
    })
}

/// The batcher on its own thread; `submit` from anywhere.
#[derive(Clone)]
pub struct Scheduler {
    model: Arc<Model>,
    cfg: SchedulerConfig,
    held: Arc<Held>,
    usage: Arc<Mutex<KvUsage>>,
    stop: Arc<Mutex<Option<String>>>,
    inject: Arc<AtomicBool>,
    /// Why the scheduler stopped for good, once it has.
    dead: Arc<watch::Sender<Option<String>>>,
    tx: std_mpsc::Sender<Running>,
}

/// The scheduler thread's state. Dropped when the thread ends; after a panic outside a step
/// it says the scheduler is dead and ends what it still holds.
struct Worker {
    batcher: Batcher,
    rx: std_mpsc::Receiver<Running>,
    dead: Arc<watch::Sender<Option<String>>>,
    faults: VecDeque<Instant>,
}

impl Worker {
    fn run(&mut self) {
        loop {
            if self.batcher.is_idle() {
                match self.rx.recv() {
                    Ok(r) => self.batcher.waiting.push_back(r),
                    Err(_) => return,
                }
            }
            while let Ok(r) = self.rx.try_recv() {
                self.batcher.waiting.push_back(r);
            }
            let Ok(rows) = self.batcher.step_contained() else {
                let now = Instant::now();
                self.faults
                    .retain(|t| now.saturating_duration_since(*t) < FAULT_WINDOW);
                self.faults.push_back(now);
                if self.faults.len() >= FAULTS_TO_DIE {
                    self.die(format!(
                        "{DEAD}: {} internal faults within {} s; restart the edge",
                        self.faults.len(),
                        FAULT_WINDOW.as_secs()
                    ));
                    return;
                }
                continue;
            };
            // Waiting for a cloud layer and nothing else to run: nap, open to new jobs.
            if rows == 0 && self.batcher.waits_for_layers() {
                if let Ok(r) = self.rx.recv_timeout(Duration::from_millis(1)) {
                    self.batcher.waiting.push_back(r);
                }
            }
        }
    }

    /// Say why the scheduler is dead (the first reason stays), then end every request it holds.
    fn die(&mut self, why: String) {
        tracing::error!("{why}");
        self.dead.send_if_modified(|d| {
            let first = d.is_none();
            if first {
                *d = Some(why.clone());
            }
            first
        });
        let why = self.dead.borrow().clone().unwrap_or(why);
        self.batcher.fail_all(&why, "fault");
        while let Ok(r) = self.rx.try_recv() {
            fail(r, &why, "fault", &self.batcher.metrics);
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Ending otherwise is dying (already said) or every handle gone (nobody to tell).
        if std::thread::panicking() && self.dead.borrow().is_none() {
            self.die(format!(
                "{DEAD}: its thread panicked outside a step; restart the edge"
            ));
        }
    }
}

impl Scheduler {
    pub fn start(
        model: Arc<Model>,
        cfg: SchedulerConfig,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Self> {
        let batcher = Batcher::new(model.clone(), cfg.clone(), metrics);
        let (tx, rx) = std_mpsc::channel::<Running>();
        let (held, usage, stop, inject) = (
            batcher.held.clone(),
            batcher.usage.clone(),
            batcher.stop.clone(),
            batcher.inject.clone(),
        );
        let dead = Arc::new(watch::Sender::new(None));
        let mut worker = Worker {
            batcher,
            rx,
            dead: dead.clone(),
            faults: VecDeque::new(),
        };
        std::thread::Builder::new()
            .name("edgeprompt-scheduler".into())
            .spawn(move || worker.run())?;
        Ok(Self {
            model,
            cfg,
            held,
            usage,
            stop,
            inject,
            dead,
            tx,
        })
    }

    /// Tests only: make the next step that runs the model panic after its forward pass.
    #[doc(hidden)]
    pub fn inject_panic_next_step(&self) {
        self.inject.store(true, Ordering::Release);
    }

    /// Why the scheduler stopped for good (it serves nothing more), or `None` while it runs.
    pub fn dead(&self) -> Option<String> {
        self.dead.borrow().clone()
    }

    /// Resolves with the reason once the scheduler is dead.
    pub fn wait_dead(&self) -> impl Future<Output = String> + Send + 'static {
        let mut rx = self.dead.subscribe();
        async move {
            let got = rx.wait_for(Option::is_some).await.map(|d| d.clone());
            match got {
                Ok(d) => d.unwrap_or_default(),
                // The sender lives as long as this scheduler: not reached while it does.
                Err(_) => std::future::pending().await,
            }
        }
    }

    /// Admit a job (its KV reserved now) or refuse it with the reason.
    pub fn submit(&self, job: Job) -> Result<(), Refusal> {
        self.submit_with(job, Extras::default())
    }

    /// `submit`, with log-probabilities and further answers.
    pub fn submit_with(&self, job: Job, extras: Extras) -> Result<(), Refusal> {
        if let Some(why) = self.dead() {
            return Err(Refusal::Dead(why));
        }
        if self.stop.lock().map_or(true, |s| s.is_some()) {
            return Err(Refusal::Stopped);
        }
        let r = admission(&self.model, &self.cfg, &self.held, job, extras)?;
        self.tx.send(r).map_err(|_| Refusal::Stopped)
    }

    /// Requests admitted and not yet ended (queued or running).
    pub fn pending(&self) -> usize {
        self.held.requests.load(Ordering::Acquire)
    }

    /// Private KV bytes the admitted requests have reserved (of `kv_budget_bytes`).
    pub fn reserved_bytes(&self) -> usize {
        self.held.bytes.load(Ordering::Acquire)
    }

    /// End every request still queued or running with [`STOPPED`] (at the next step) and
    /// refuse new ones: the end of a drain that ran out of time.
    pub fn stop(&self) {
        if let Ok(mut s) = self.stop.lock() {
            *s = Some(STOPPED.to_string());
        }
        // No wake-up needed: the thread only sleeps when it holds no request.
    }

    pub fn usage(&self) -> KvUsage {
        self.usage.lock().map(|u| *u).unwrap_or_default()
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }
}
