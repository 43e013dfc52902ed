//! The batch and its queue: each step plans what every running request feeds (a chunk of
//! its prompt, its next token, or nothing while its cloud layers are on their way), then
//! applies one forward pass to the plan.

use std::collections::{HashSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use edgeprompt_engine::{sample_each, Draw, Model, Sequence, TokenLogprobs};

use super::admission::admission;
use super::plan::{plan, Want};
use super::reservation::Held;
use super::running::{emit, fail, Drawn, Running};
use super::{Event, Extras, Failure, Job, KvUsage, Refusal, SchedulerConfig, FAULT};
use crate::metrics::Metrics;
/// The batch and its queue, stepped by the scheduler thread (or by hand in tests).
pub struct Batcher {
    pub(super) model: Arc<Model>,
    pub(super) cfg: SchedulerConfig,
    pub(super) metrics: Arc<Metrics>,
    pub(super) waiting: VecDeque<Running>,
    pub(super) active: Vec<Running>,
    pub(super) held: Arc<Held>,
    pub(super) usage: Arc<Mutex<KvUsage>>,
    /// Set by `Scheduler::stop`: every request still here ends with this reason.
    pub(super) stop: Arc<Mutex<Option<Failure>>>,
    /// Tests only: the next step that runs the model panics.
    pub(super) inject: Arc<AtomicBool>,
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
    pub(super) fn step_contained(&mut self) -> Result<usize, ()> {
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
                self.fail_active(&Failure::internal(FAULT), "fault");
                Err(())
            }
        }
    }

    /// End every running request with `why`, counted under `outcome`.
    fn fail_active(&mut self, why: &Failure, outcome: &str) {
        for r in self.active.drain(..) {
            fail(r, why, outcome, &self.metrics);
        }
        self.publish();
    }

    /// End every running and queued request with `why`, counted under `outcome`.
    pub(super) fn fail_all(&mut self, why: &Failure, outcome: &str) {
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
        let wants: Vec<Want> = self.active.iter().map(Running::want).collect();
        let feeds = plan(&wants, budget)
            .into_iter()
            .zip(&self.active)
            .map(|(f, r)| f.map(|f| r.feed(f)))
            .collect();
        self.apply(feeds)
    }

    /// Run one step's feeds (one per running request, `None`: nothing this step): one
    /// forward pass, the decoding rows' tokens drawn together, every fed request advanced.
    fn apply(&mut self, feeds: Vec<Option<Vec<u32>>>) -> usize {
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
                        let _ = r
                            .job
                            .events
                            .send(Event::Failed(Failure::internal(e.to_string())));
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
                let _ = r
                    .job
                    .events
                    .send(Event::Failed(Failure::timed_out(timeout)));
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
