//! The servers nodes are made of.

use std::collections::VecDeque;

/// `cores` identical servers in front of one FIFO queue: a job runs on the first free core
/// for its whole service time (a cloud prefilling one prompt per core).
pub struct Fifo<J> {
    cores: usize,
    busy: usize,
    queue: VecDeque<(J, f64)>,
    /// Seconds all cores were busy, summed over cores (for utilisation).
    pub busy_secs: f64,
}

impl<J> Fifo<J> {
    pub fn new(cores: usize) -> Self {
        Self {
            cores: cores.max(1),
            busy: 0,
            queue: VecDeque::new(),
            busy_secs: 0.0,
        }
    }

    /// A job needing `service` seconds arrives: `Some` when it starts now (schedule its end
    /// `service` from now), `None` when it waits.
    pub fn arrive(&mut self, job: J, service: f64) -> Option<(J, f64)> {
        if self.busy < self.cores {
            self.busy += 1;
            self.busy_secs += service;
            Some((job, service))
        } else {
            self.queue.push_back((job, service));
            None
        }
    }

    /// A job ended: the next one to start on the freed core, if any.
    pub fn depart(&mut self) -> Option<(J, f64)> {
        match self.queue.pop_front() {
            Some((job, service)) => {
                self.busy_secs += service;
                Some((job, service))
            }
            None => {
                self.busy = self.busy.saturating_sub(1);
                None
            }
        }
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }
}

/// The work of one batching step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Work {
    /// Sequences decoding one token each.
    pub decoding: usize,
    /// Tokens those sequences attend to, summed.
    pub context: f64,
    /// Prompt tokens prefilled.
    pub prefill: usize,
    /// (prompt token, earlier token) pairs the prefilled tokens attend to: a chunk of `n`
    /// after `o` tokens adds `n (o + (n + 1) / 2)`.
    pub prefill_attend: f64,
}

/// What a continuous-batching node costs per step, from measured curves.
pub trait StepCost {
    fn step_secs(&self, work: &Work) -> f64;
}

/// A request for a batching server: prompt tokens to prefill, then tokens to generate.
#[derive(Debug, Clone)]
pub struct Job<T> {
    pub tag: T,
    pub prompt: usize,
    pub output: usize,
    /// Tokens the sequence attends to besides its own (a shared cloud prompt).
    pub prefix: usize,
}

struct Running<T> {
    job: Job<T>,
    prefilled: usize,
    generated: usize,
}

/// A continuous-batching server: each step decodes one token for every sequence whose prompt
/// is in and prefills at most `chunk` prompt tokens (oldest first); waiting requests join
/// at a step's start while fewer than `max_batch` run. The first token comes with the step
/// that finishes the prompt, as in the edge's scheduler.
pub struct Batcher<T> {
    max_batch: usize,
    chunk: usize,
    waiting: VecDeque<Job<T>>,
    running: Vec<Running<T>>,
    stepping: bool,
    pub busy_secs: f64,
}

/// What a step did: its length, the requests whose first token it made, those it finished.
pub struct Step<T> {
    pub secs: f64,
    pub first_tokens: Vec<T>,
    pub finished: Vec<T>,
}

impl<T: Clone> Batcher<T> {
    pub fn new(max_batch: usize, chunk: usize) -> Self {
        Self {
            max_batch: max_batch.max(1),
            chunk: chunk.max(1),
            waiting: VecDeque::new(),
            running: Vec::new(),
            stepping: false,
            busy_secs: 0.0,
        }
    }

    /// A request arrives; `true` when the server was idle and a step must be started.
    pub fn arrive(&mut self, job: Job<T>) -> bool {
        self.waiting.push_back(job);
        !self.stepping
    }

    /// Plan the next step (call when `arrive` says so, and when a step ends): `None` when
    /// there is nothing to do. The step's effects are returned now; schedule its end `secs`
    /// from now and call `step` again then.
    pub fn step(&mut self, cost: &impl StepCost) -> Option<Step<T>> {
        while self.running.len() < self.max_batch {
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            self.running.push(Running {
                job,
                prefilled: 0,
                generated: 0,
            });
        }
        if self.running.is_empty() {
            self.stepping = false;
            return None;
        }
        self.stepping = true;
        let decoding: Vec<usize> = (0..self.running.len())
            .filter(|&i| self.running[i].prefilled == self.running[i].job.prompt)
            .collect();
        let mut work = Work {
            decoding: decoding.len(),
            context: decoding
                .iter()
                .map(|&i| {
                    let r = &self.running[i];
                    (r.job.prefix + r.job.prompt + r.generated) as f64
                })
                .sum(),
            ..Work::default()
        };
        let mut budget = self.chunk;
        let mut first_tokens = Vec::new();
        for r in self.running.iter_mut() {
            if r.prefilled < r.job.prompt && budget > 0 {
                let n = (r.job.prompt - r.prefilled).min(budget);
                let before = (r.job.prefix + r.prefilled) as f64;
                work.prefill_attend += n as f64 * (before + (n as f64 + 1.0) / 2.0);
                work.prefill += n;
                r.prefilled += n;
                budget -= n;
                if r.prefilled == r.job.prompt {
                    r.generated = 1;
                    first_tokens.push(r.job.tag.clone());
                }
            }
        }
        for &i in &decoding {
            let r = &mut self.running[i];
            // A job with no prompt of its own gets its first token from its first step.
            if r.generated == 0 {
                first_tokens.push(r.job.tag.clone());
            }
            r.generated += 1;
        }
        let secs = cost.step_secs(&work);
        self.busy_secs += secs;
        let mut finished = Vec::new();
        self.running.retain(|r| {
            let done = r.prefilled == r.job.prompt && r.generated >= r.job.output.max(1);
            if done {
                finished.push(r.job.tag.clone());
            }
            !done
        });
        Some(Step {
            secs,
            first_tokens,
            finished,
        })
    }

    /// No step is under way (the next arrival must start one).
    pub fn idle(&self) -> bool {
        !self.stepping
    }

    /// Requests waiting for a batch slot and running.
    pub fn load(&self) -> (usize, usize) {
        (self.waiting.len(), self.running.len())
    }
}
