//! Admission: a job checked against the model and the budgets, its KV reserved, made a
//! running request that waits for a batch slot.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use edgeprompt_engine::sequence::PrefillPass;
use edgeprompt_engine::{Model, Sampler, Sequence, TextStream};

use super::cold::Cold;
use super::reservation::{Held, Reservation};
use super::running::Running;
use super::{Extras, Job, Refusal, SchedulerConfig};
use crate::pipeline::Timeline;

/// KV bytes one token takes in every attention layer.
pub fn kv_bytes_per_token(model: &Model) -> usize {
    model.cfg.kv_bytes_per_token()
}

pub(super) fn admission(
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
