//! The scheduler thread: the batcher stepped in a loop, jobs submitted from anywhere, faults
//! contained, and the scheduler declared dead when they keep coming.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use edgeprompt_engine::Model;
use tokio::sync::watch;

use crate::metrics::Metrics;

use super::admission::admission;
use super::batcher::Batcher;
use super::reservation::Held;
use super::running::{fail, Running};
use super::{
    Extras, Failure, Job, KvUsage, Refusal, SchedulerConfig, DEAD, FAULTS_TO_DIE, FAULT_WINDOW,
    STOPPED,
};

/// The batcher on its own thread; `submit` from anywhere.
#[derive(Clone)]
pub struct Scheduler {
    model: Arc<Model>,
    cfg: SchedulerConfig,
    held: Arc<Held>,
    usage: Arc<Mutex<KvUsage>>,
    stop: Arc<Mutex<Option<Failure>>>,
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
        let why = Failure::dead(self.dead.borrow().clone().unwrap_or(why));
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
            *s = Some(STOPPED);
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
