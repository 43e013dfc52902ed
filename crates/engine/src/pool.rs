//! A small fork-join pool for the forward pass's parallel loops (matmul tiles, attention).
//!
//! A decode step makes ~170 parallel calls of 10-300 µs each. Handing each to rayon from a
//! thread outside its pool costs a sleep and a wake-up per call (tens of µs); here the helper
//! threads spin briefly (yielding) between calls and the caller works on its own job, so a
//! call costs about an atomic round trip. Tasks are claimed from a shared counter; which
//! thread runs a task never changes its result.
//!
//! The caller waits only for helpers that took a seat at its job before it closed the job:
//! on busy cores a helper may not run for milliseconds, and a caller that has run every task
//! itself must not wait for it to wake up and find nothing left.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{LazyLock, Mutex};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long an idle helper polls for the next call before it parks.
const SPIN: Duration = Duration::from_micros(300);

struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    tasks: usize,
    next: AtomicUsize,
}

impl Job<'_> {
    fn work(&self) {
        loop {
            let t = self.next.fetch_add(1, Relaxed);
            if t >= self.tasks {
                return;
            }
            (self.f)(t);
        }
    }
}

/// `Shared::gate`: set while no job takes helpers; the other bits count the seated helpers.
const CLOSED: usize = 1 << (usize::BITS - 1);

struct Shared {
    epoch: AtomicU64,
    job: AtomicPtr<Job<'static>>,
    /// CLOSED, or the number of helpers working on the current job.
    gate: AtomicUsize,
    sleepers: AtomicUsize,
    panicked: AtomicBool,
}

impl Shared {
    /// A seat at the current job, unless it is closed.
    fn take_seat(&self) -> bool {
        let mut g = self.gate.load(Acquire);
        while g & CLOSED == 0 {
            match self.gate.compare_exchange_weak(g, g + 1, AcqRel, Acquire) {
                Ok(_) => return true,
                Err(now) => g = now,
            }
        }
        false
    }
}

struct Pool {
    shared: &'static Shared,
    helpers: Vec<Thread>,
    /// One call at a time; a concurrent caller from outside waits for its turn (running its
    /// tasks itself instead would put three busy threads on two cores, and the fork-join
    /// would wait on whichever is descheduled).
    busy: Mutex<()>,
}

static POOL: LazyLock<Pool> = LazyLock::new(|| {
    let shared: &'static Shared = Box::leak(Box::new(Shared {
        epoch: AtomicU64::new(0),
        job: AtomicPtr::new(std::ptr::null_mut()),
        gate: AtomicUsize::new(CLOSED),
        sleepers: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
    }));
    let n = rayon::current_num_threads().saturating_sub(1);
    let helpers = (0..n)
        .filter_map(|i| {
            std::thread::Builder::new()
                .name(format!("edgeprompt-pool-{i}"))
                .spawn(move || helper(shared))
                .ok()
                .map(|h| h.thread().clone())
        })
        .collect();
    Pool {
        shared,
        helpers,
        busy: Mutex::new(()),
    }
});

thread_local! {
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

fn helper(s: &'static Shared) {
    IN_POOL.with(|c| c.set(true));
    let mut seen = 0;
    loop {
        let start = Instant::now();
        while s.epoch.load(Acquire) == seen {
            if start.elapsed() < SPIN {
                std::thread::yield_now();
                continue;
            }
            s.sleepers.fetch_add(1, SeqCst);
            if s.epoch.load(SeqCst) == seen {
                std::thread::park();
            }
            s.sleepers.fetch_sub(1, SeqCst);
        }
        seen = s.epoch.load(Acquire);
        // Too late (the caller ran every task and closed the job): nothing to wait for us.
        if !s.take_seat() {
            continue;
        }
        // SAFETY: the job was published before the gate opened, and the caller keeps it alive
        // until every seated helper has left its seat. A seat may belong to a job newer than
        // the epoch seen; the pointer read after taking it is that job's.
        let job = unsafe { &*s.job.load(Acquire) };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.work())).is_err() {
            s.panicked.store(true, SeqCst);
        }
        s.gate.fetch_sub(1, Release);
    }
}

/// Runs `f(0..tasks)` across the pool's threads and the caller; returns when all are done.
pub fn run(tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    let inline = || (0..tasks).for_each(f);
    if tasks <= 1 || IN_POOL.with(|c| c.get()) {
        return inline();
    }
    let pool = &*POOL;
    // A task that panicked poisoned nothing: every helper had left the job before the unwind.
    let _guard = pool.busy.lock().unwrap_or_else(|p| p.into_inner());
    if pool.helpers.is_empty() {
        return inline();
    }
    let s = pool.shared;
    let job = Job {
        f,
        tasks,
        next: AtomicUsize::new(0),
    };
    // A flag left by a call whose own task unwound first is that call's, not this one's.
    s.panicked.store(false, SeqCst);
    // The 'static lifetime is a promise kept below: we close the job and wait for every seated
    // helper before returning.
    s.job.store(&job as *const Job as *mut Job<'static>, SeqCst);
    s.gate.store(0, SeqCst);
    s.epoch.fetch_add(1, SeqCst);
    if s.sleepers.load(SeqCst) > 0 {
        for t in &pool.helpers {
            t.unpark();
        }
    }
    // Waits for the seated helpers even if a task panics here: they hold a reference to `job`.
    struct Wait<'a>(&'a Pool);
    impl Drop for Wait<'_> {
        fn drop(&mut self) {
            IN_POOL.with(|c| c.set(false));
            let s = self.0.shared;
            s.gate.fetch_or(CLOSED, AcqRel);
            let mut spins = 0u32;
            while s.gate.load(Acquire) != CLOSED {
                spins += 1;
                if spins < 1 << 12 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }
    let wait = Wait(pool);
    IN_POOL.with(|c| c.set(true));
    job.work();
    drop(wait);
    if s.panicked.swap(false, SeqCst) {
        panic!("a parallel task panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_in_every_call() {
        for round in 0..5000 {
            let tasks = 1 + round % 37;
            let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            run(tasks, &|t| {
                hits[t].fetch_add(1, Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "round {round}");
        }
    }

    #[test]
    fn a_call_after_one_whose_every_task_panicked_runs_clean() {
        for _ in 0..20 {
            let r = std::panic::catch_unwind(|| run(64, &|_| panic!("every task")));
            assert!(r.is_err());
            let n = AtomicUsize::new(0);
            run(64, &|_| {
                n.fetch_add(1, Relaxed);
            });
            assert_eq!(n.load(Relaxed), 64);
        }
    }

    #[test]
    fn no_task_is_running_when_a_call_returns() {
        let running = AtomicUsize::new(0);
        for round in 0..300 {
            run(8, &|t| {
                running.fetch_add(1, SeqCst);
                // Tasks of uneven length, so a helper may still be in one as the caller ends.
                let mut x = 0u64;
                for i in 0..(t as u64 * 500 + round % 7 * 300) {
                    x = std::hint::black_box(x.wrapping_add(i));
                }
                running.fetch_sub(1, SeqCst);
            });
            assert_eq!(running.load(SeqCst), 0, "round {round}");
        }
    }

    #[test]
    fn a_panicking_task_is_reported_and_the_pool_goes_on() {
        let r = std::panic::catch_unwind(|| run(64, &|t| assert!(t != 40, "task 40")));
        assert!(r.is_err());
        let sum = AtomicUsize::new(0);
        run(64, &|t| {
            sum.fetch_add(t, Relaxed);
        });
        assert_eq!(sum.load(Relaxed), 64 * 63 / 2);
    }
}
