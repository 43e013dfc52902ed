//! One admitted request: its sequence, sampler and answer so far, and how a step's logits
//! advance it (scored, sampled, sent, finished).

use std::time::Instant;

use edgeprompt_engine::{
    draw, logprobs, Constraint, Model, Sampler, Sequence, TextStream, TokenLogprobs,
};
use tokio::sync::mpsc;

use super::cold::Cold;
use super::plan::{Feed, Want};
use super::reservation::Reservation;
use super::{Done, Event, Failure, Job, Keep, Served};
use crate::metrics::Metrics;
use crate::pipeline::Timeline;

pub(super) struct Running {
    pub(super) job: Job,
    pub(super) seq: Sequence,
    pub(super) fed: usize,
    pub(super) next: Option<u32>,
    pub(super) sampler: Sampler,
    pub(super) constraint: Option<Constraint>,
    pub(super) text: TextStream,
    pub(super) admitted: Instant,
    pub(super) first_token: Option<Instant>,
    pub(super) last_token: Option<Instant>,
    pub(super) logprobs: Option<usize>,
    pub(super) token_logprobs: Vec<TokenLogprobs>,
    /// The prompt's scores so far (tokens 1.. in order; token 0 once the prompt is in), when
    /// asked for.
    pub(super) prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    /// Answers still to fork off once the prompt is in, each with its reservation.
    pub(super) forks: Vec<(mpsc::UnboundedSender<Event>, Reservation)>,
    /// The private prefill against a cloud prompt still streaming; `seq` is empty until done.
    pub(super) cold: Option<Cold>,
    pub(super) timeline: Option<Timeline>,
    pub(super) keep: Option<Keep>,
    pub(super) client: Option<std::net::IpAddr>,
    pub(super) _reservation: Reservation,
}

/// A row's next token, or why its grammar could not give one.
pub(super) type Drawn = Result<u32, edgeprompt_engine::GrammarError>;

impl Running {
    /// What this request can take in the next step.
    pub(super) fn want(&self) -> Want {
        match (
            &self.cold,
            self.job.prompt.len() - self.fed.min(self.job.prompt.len()),
        ) {
            (Some(_), _) => Want::Layers,
            (None, 0) => Want::Token(self.next.is_some()),
            (None, left) => Want::Prompt(left),
        }
    }

    /// The tokens a planned feed stands for.
    pub(super) fn feed(&self, f: Feed) -> Vec<u32> {
        match f {
            Feed::Prompt(n) => self.job.prompt[self.fed..self.fed + n].to_vec(),
            Feed::Token => self.next.map_or_else(Vec::new, |id| vec![id]),
        }
    }

    /// Alternatives per scored prompt row, while the prompt is still being scored.
    pub(super) fn scoring(&self) -> Option<usize> {
        let asked = self.prompt_logprobs.is_some() && self.fed < self.job.prompt.len();
        asked.then(|| self.logprobs.unwrap_or(0))
    }

    /// Add a prefill step's prompt scores (`fed` already counts its rows): the rows' own, then
    /// the next token's from the last row's `logits`; once the prompt is in, its first token's
    /// from the cloud prompt's last row.
    pub(super) fn score_prompt(
        &mut self,
        model: &Model,
        logits: &[f32],
        rows: Vec<TokenLogprobs>,
    ) -> Result<(), Failure> {
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
                .map_err(|e| Failure::internal(e.to_string()))?
                .map(|l| logprobs(&l, prompt[0], top)),
            None => None,
        };
        scores.insert(0, first);
        Ok(())
    }

    /// The further answers, each a copy of this sequence (the prompt's KV) and its own sampler.
    pub(super) fn fork(&mut self) -> Vec<Running> {
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

/// Sample `r`'s next token from `logits` (or take the one `drawn` from them) and send what it
/// makes final; true when the answer is over.
pub(super) fn emit(
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
            let _ = r
                .job
                .events
                .send(Event::Failed(Failure::internal(e.to_string())));
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
            let _ = r
                .job
                .events
                .send(Event::Failed(Failure::internal(e.to_string())));
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
pub(super) fn fail(r: Running, why: &Failure, outcome: &str, metrics: &Metrics) {
    let _ = r.job.events.send(Event::Failed(why.clone()));
    for (f, _) in &r.forks {
        let _ = f.send(Event::Failed(why.clone()));
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
