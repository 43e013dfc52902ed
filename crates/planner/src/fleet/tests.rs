//! The simulator against queues with known answers.

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::server::{Batcher, Fifo, Job, StepCost};
use super::{exponential, Clock, Poisson};

enum Ev {
    Arrive,
    Depart(f64),
}

/// Mean time in system of `n` customers through a FIFO of `cores` cores, Poisson arrivals of
/// `rate`, service times from `service`.
fn fifo_mean(cores: usize, rate: f64, n: usize, mut service: impl FnMut() -> f64) -> f64 {
    let mut clock = Clock::default();
    let mut fifo = Fifo::new(cores);
    let mut arrivals = Poisson::new(rate, 11);
    let (mut arrived, mut done, mut total) = (0, 0, 0.0);
    clock.schedule(arrivals.gap(), Ev::Arrive);
    while let Some(ev) = clock.advance() {
        let now = clock.now();
        match ev {
            Ev::Arrive => {
                arrived += 1;
                if arrived < n {
                    clock.schedule(arrivals.gap(), Ev::Arrive);
                }
                if let Some((at, s)) = fifo.arrive(now, service()) {
                    clock.schedule(s, Ev::Depart(at));
                }
            }
            Ev::Depart(at) => {
                total += now - at;
                done += 1;
                if let Some((at, s)) = fifo.depart() {
                    clock.schedule(s, Ev::Depart(at));
                }
            }
        }
    }
    assert_eq!(done, n, "every customer left");
    total / n as f64
}

fn close(got: f64, want: f64, tol: f64, what: &str) {
    let err = (got - want).abs() / want;
    assert!(
        err < tol,
        "{what}: {got:.4} vs {want:.4} ({:.2} %)",
        100.0 * err
    );
    eprintln!(
        "{what}: {got:.4} vs theory {want:.4} ({:.2} %)",
        100.0 * err
    );
}

#[test]
fn mm1_mean_time_in_system_is_one_over_mu_minus_lambda() {
    let mut rng = StdRng::seed_from_u64(5);
    let (lambda, mu) = (0.5, 1.0);
    let got = fifo_mean(1, lambda, 1_000_000, || exponential(&mut rng, mu));
    close(got, 1.0 / (mu - lambda), 0.02, "M/M/1");
}

#[test]
fn mm2_mean_time_in_system_follows_erlang_c() {
    let mut rng = StdRng::seed_from_u64(6);
    let (lambda, mu, c) = (1.5, 1.0, 2);
    let a: f64 = lambda / mu;
    let tail = a.powi(c) / 2.0 * (c as f64 / (c as f64 - a));
    let erlang_c = tail / (1.0 + a + tail);
    let want = 1.0 / mu + erlang_c / (c as f64 * mu - lambda);
    let got = fifo_mean(c as usize, lambda, 1_000_000, || exponential(&mut rng, mu));
    close(got, want, 0.02, "M/M/2");
}

/// A batching server of one slot whose steps each cost `d`: requests of `n` tokens are
/// served in `n d` exactly, an M/D/1 queue.
struct Flat(f64);

impl StepCost for Flat {
    fn step_secs(&self, decoding: usize, _context: f64, prefill: usize) -> f64 {
        assert!(decoding + prefill > 0, "a step does something");
        self.0
    }
}

#[test]
fn a_one_slot_batcher_is_md1() {
    enum Ev {
        Arrive,
        StepEnd(Vec<(u64, f64)>),
    }
    let (lambda, tokens, d) = (0.5, 4, 0.25);
    let mut clock = Clock::default();
    let mut b: Batcher<(u64, f64)> = Batcher::new(1, 64);
    let mut arrivals = Poisson::new(lambda, 12);
    let n = 400_000u64;
    let (mut id, mut done, mut total) = (0u64, 0u64, 0.0);
    clock.schedule(arrivals.gap(), Ev::Arrive);
    while let Some(ev) = clock.advance() {
        let now = clock.now();
        let plan = match ev {
            Ev::Arrive => {
                id += 1;
                if id < n {
                    clock.schedule(arrivals.gap(), Ev::Arrive);
                }
                let job = Job {
                    tag: (id, now),
                    prompt: 0,
                    output: tokens,
                    prefix: 0,
                };
                b.arrive(job)
            }
            Ev::StepEnd(finished) => {
                for (_, at) in finished {
                    total += now - at;
                    done += 1;
                }
                true
            }
        };
        if plan {
            if let Some(s) = b.step(&Flat(d)) {
                clock.schedule(s.secs, Ev::StepEnd(s.finished));
            }
        }
    }
    assert_eq!(done, n);
    let mu = 1.0 / (tokens as f64 * d);
    let rho = lambda / mu;
    let want = 1.0 / mu + rho / (2.0 * mu * (1.0 - rho));
    close(total / n as f64, want, 0.02, "M/D/1 through the batcher");
}

/// Prefill and decode mix as the edge's scheduler mixes them: a prompt longer than the chunk
/// takes several steps, decoding sequences keep stepping, and the first token comes with the
/// step that ends the prompt.
#[test]
fn the_batcher_chunks_prompts_and_decodes_alongside() {
    let mut b: Batcher<u32> = Batcher::new(8, 100);
    let cost = Flat(1.0);
    assert!(b.arrive(Job {
        tag: 1,
        prompt: 0,
        output: 3,
        prefix: 512,
    }));
    // No prompt of its own: the first token with the first step.
    let s = b.step(&cost).unwrap();
    assert!(s.first_tokens == vec![1] && s.finished.is_empty());
    b.arrive(Job {
        tag: 2,
        prompt: 250,
        output: 2,
        prefix: 0,
    });
    // 100, 100, 50 prompt tokens: the first token at the third step, while 1 decodes on.
    let s = b.step(&cost).unwrap();
    assert!(s.first_tokens.is_empty());
    let s = b.step(&cost).unwrap();
    assert_eq!(s.finished, vec![1]);
    let s = b.step(&cost).unwrap();
    assert_eq!(s.first_tokens, vec![2]);
    let s = b.step(&cost).unwrap();
    assert_eq!(s.finished, vec![2]);
    assert!(b.step(&cost).is_none());
    assert_eq!(b.load(), (0, 0));
}

mod fleet {
    use super::super::model::{simulate, Costs, Fleet, Kv, Link, Mode, Request};

    fn costs(per_token: f64, step: f64) -> Costs {
        Costs {
            prefill_fixed: 0.0,
            prefill_per_token: per_token,
            prefill_per_token2: 0.0,
            step_fixed: step,
            step_per_seq: 0.0,
            step_per_ctx: 0.0,
        }
    }

    fn fleet() -> Fleet {
        Fleet {
            edges: 2,
            edge: costs(0.001, 0.02),
            cloud: costs(0.0002, 0.03),
            cloud_prefill_slots: 1,
            cloud_batch: 8,
            chunk: 2048,
            edge_batch: 8,
            kv_bytes_per_token: 12_288,
            link: Link {
                bytes_per_sec: 12.5e6,
                rtt_secs: 0.04,
            },
            client_link: Link {
                bytes_per_sec: 12.5e6,
                rtt_secs: 0.04,
            },
            prompts: vec![512, 1024],
        }
    }

    fn req(at: f64, edge: usize, prompt: usize) -> Request {
        Request {
            at,
            edge,
            prompt,
            private: 100,
            output: 10,
        }
    }

    /// Requests far apart: each latency is the sum of its parts.
    #[test]
    fn lone_requests_cost_the_sum_of_their_parts() {
        let f = fleet();
        let r = [req(0.0, 0, 0), req(10.0, 0, 0), req(20.0, 1, 0)];
        let o = simulate(&f, Mode::EdgePrompt, &r);
        let fetch = 0.04 + 512.0 * 12_288.0 / 12.5e6;
        let answer = 100.0 * 0.001 + 9.0 * 0.02;
        let near = |a: f64, b: f64| assert!((a - b).abs() < 1e-9, "{a} vs {b}");
        near(o[0].latency, 512.0 * 0.0002 + fetch + answer);
        assert_eq!(o[0].kv, Kv::Prefilled);
        near(o[1].latency, answer);
        assert_eq!(o[1].kv, Kv::Memory);
        near(o[2].latency, fetch + answer);
        assert_eq!(o[2].kv, Kv::Cloud);
        near(o[0].ttft, 512.0 * 0.0002 + fetch + 0.1);
        let c = simulate(&f, Mode::CloudOnly, &r);
        near(c[0].latency, 612.0 * 0.0002 + 9.0 * 0.03 + 0.04);
        // A step costs at least its fixed part: the 100-token prefill takes a whole step.
        near(c[1].latency, 0.03 + 9.0 * 0.03 + 0.04);
        assert!(c.iter().all(|o| o.kv == Kv::CloudOnly));
    }

    /// Requests on a prompt whose fetch is under way wait for it; the cloud prefills it once.
    #[test]
    fn a_burst_shares_one_prefill_and_one_fetch_per_edge() {
        let f = fleet();
        let r: Vec<Request> = (0..6).map(|i| req(0.001 * i as f64, i % 2, 1)).collect();
        let o = simulate(&f, Mode::EdgePrompt, &r);
        assert!(o
            .iter()
            .all(|o| o.kv == Kv::Prefilled && o.latency.is_finite()));
        // One prefill, then both edges' fetches at once; each edge prefills its three private
        // prompts in one step (0.3 s). A second prefill would add 0.2 s.
        let landed = 1024.0 * 0.0002 + 0.04 + 1024.0 * 12_288.0 / 12.5e6;
        for (i, o) in o.iter().enumerate() {
            let want = landed + 0.3 - 0.001 * i as f64;
            assert!((o.ttft - want).abs() < 1e-9, "{i}: {} vs {want}", o.ttft);
        }
    }
}
