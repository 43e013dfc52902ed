//! The simulator against queues with known answers.

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::server::{Batcher, Fifo, Job, StepCost, Work};
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
    fn step_secs(&self, w: &Work) -> f64 {
        assert!(w.decoding + w.prefill > 0, "a step does something");
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
    use super::super::model::{simulate, Costs, Fleet, Home, Kv, Link, Mode, Request, Store};

    fn costs(per_token: f64, step: f64) -> Costs {
        Costs {
            fixed: step,
            per_token,
            per_seq: 0.0,
            per_attend: 0.0,
        }
    }

    const LINK: Link = Link {
        bytes_per_sec: 12.5e6,
        rtt_secs: 0.04,
    };
    const FETCH: f64 = 0.04 + 512.0 * 12_288.0 / 12.5e6;
    /// A 100-token private prompt in one step, then 9 decode steps.
    const ANSWER: f64 = 0.02 + 100.0 * 0.001 + 9.0 * 0.02;
    /// The cloud's prefill of the 512-token prompt.
    const PREFILL: f64 = 0.03 + 512.0 * 0.0002;

    fn near(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-9, "{a} vs {b}");
    }

    fn fleet() -> Fleet {
        Fleet {
            edges: 2,
            edge: costs(0.001, 0.02),
            cloud: costs(0.0002, 0.03),
            cloud_nodes: 1,
            home: Home::Edge,
            cloud_prefill_slots: 1,
            cloud_hosts: 0,
            cloud_batch: 8,
            chunk: 2048,
            edge_batch: 8,
            kv_bytes_per_token: 12_288,
            edge_layers: 0.0,
            link: LINK,
            cloud_egress: None,
            peer_link: None,
            tier_link: None,
            store: None,
            list_bytes: 0,
            client_link: Link {
                bytes_per_sec: 12.5e6,
                rtt_secs: 0.04,
            },
            prompts: vec![512, 1024],
            prefilled: 0,
            edges_warm: false,
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
        let (o, u) = simulate(&f, Mode::EdgePrompt, &r);
        near(o[0].latency, PREFILL + FETCH + ANSWER);
        assert_eq!(o[0].kv, Kv::Prefilled);
        near(o[1].latency, ANSWER);
        assert_eq!(o[1].kv, Kv::Memory);
        near(o[2].latency, FETCH + ANSWER);
        assert_eq!(o[2].kv, Kv::Cloud);
        near(o[0].ttft, PREFILL + FETCH + 0.12);
        assert_eq!(u.cloud_prefills, 1);
        near(u.cloud_bytes, 2.0 * 512.0 * 12_288.0);
        near(u.edge_busy_secs[0], 2.0 * ANSWER);
        let (c, _) = simulate(&f, Mode::CloudOnly, &r);
        near(c[0].latency, 0.03 + 612.0 * 0.0002 + 9.0 * 0.03 + 0.04);
        // The second finds the prompt in the cache: its 100 tokens attend to it.
        near(c[1].latency, 0.03 + 100.0 * 0.0002 + 9.0 * 0.03 + 0.04);
        assert!(c.iter().all(|o| o.kv == Kv::CloudOnly));
    }

    /// Requests on a prompt whose fetch is under way wait for it; the cloud prefills it once.
    #[test]
    fn a_burst_shares_one_prefill_and_one_fetch_per_edge() {
        let f = fleet();
        let r: Vec<Request> = (0..6).map(|i| req(0.001 * i as f64, i % 2, 1)).collect();
        let (o, u) = simulate(&f, Mode::EdgePrompt, &r);
        assert_eq!(u.cloud_prefills, 1);
        assert!(o
            .iter()
            .all(|o| o.kv == Kv::Prefilled && o.latency.is_finite()));
        // One prefill, then both edges' fetches at once; each edge prefills its three private
        // prompts in one step (0.32 s). A second prefill would add 0.23 s.
        let landed = 0.03 + 1024.0 * 0.0002 + 0.04 + 1024.0 * 12_288.0 / 12.5e6;
        for (i, o) in o.iter().enumerate() {
            let want = landed + 0.32 - 0.001 * i as f64;
            assert!((o.ttft - want).abs() < 1e-9, "{i}: {} vs {want}", o.ttft);
        }
    }

    /// A second edge joining cold takes the prompt from the first over the peer link, and the
    /// cloud sends nothing more; a CE-LSLM edge waits for its own layers when they take longer
    /// than the wire.
    #[test]
    fn peers_serve_cold_edges_and_an_edge_computes_its_own_layers() {
        let peer = Link {
            bytes_per_sec: 125e6,
            rtt_secs: 0.001,
        };
        let f = Fleet {
            peer_link: Some(peer),
            ..fleet()
        };
        let r = [req(0.0, 0, 0), req(10.0, 1, 0)];
        let (o, u) = simulate(&f, Mode::EdgePrompt, &r);
        assert_eq!(o[1].kv, Kv::Peer);
        near(o[1].latency, peer.transfer(512 * 12_288) + ANSWER);
        near(u.cloud_bytes, 512.0 * 12_288.0);
        near(u.peer_bytes, 512.0 * 12_288.0);
        let f = Fleet {
            edge_layers: 0.75,
            edge: costs(0.002, 0.02),
            ..fleet()
        };
        let local = 0.75 * (0.02 + 512.0 * 0.002);
        let answer = 0.02 + 100.0 * 0.002 + 9.0 * 0.02;
        assert!(local > FETCH);
        let (o, _) = simulate(&f, Mode::EdgePrompt, &r);
        near(o[0].latency, (PREFILL + FETCH).max(local) + answer);
        near(o[1].latency, local + answer);
    }

    /// Two cloud nodes: without the shared tier each prefills the prompt; with it the second
    /// loads the first one's. One egress sends one prompt at a time.
    #[test]
    fn the_shared_tier_saves_prefills_and_the_egress_queues_fetches() {
        let tier = Link {
            bytes_per_sec: 1.25e9,
            rtt_secs: 0.0005,
        };
        let two = Fleet {
            cloud_nodes: 2,
            ..fleet()
        };
        let r = [req(0.0, 0, 0), req(10.0, 1, 0)];
        let (o, u) = simulate(&two, Mode::EdgePrompt, &r);
        assert_eq!((o[1].kv, u.cloud_prefills), (Kv::Prefilled, 2));
        let (o, u) = simulate(
            &Fleet {
                tier_link: Some(tier),
                ..two
            },
            Mode::EdgePrompt,
            &r,
        );
        assert_eq!((o[1].kv, u.cloud_prefills), (Kv::Tier, 1));
        near(o[1].latency, tier.transfer(512 * 12_288) + FETCH + ANSWER);
        // Egress at a tenth of the link: the second edge's fetch waits for the first's.
        let slow = 1.25e6;
        let f = Fleet {
            cloud_egress: Some(slow),
            ..fleet()
        };
        let r = [req(0.0, 0, 0), req(0.0, 1, 0)];
        let (o, _) = simulate(&f, Mode::EdgePrompt, &r);
        let send = 512.0 * 12_288.0 / slow;
        near(o[0].latency, PREFILL + send + ANSWER);
        near(o[1].latency, PREFILL + 2.0 * send + ANSWER);
    }

    /// With a store, the edge that asked first gets the prompt from the cloud node that
    /// prefilled it (the store had nothing yet); every later cold edge reads the store, one
    /// object at a time through its egress, and the cloud sends each edge only its list.
    #[test]
    fn cold_edges_read_the_store_and_the_cloud_sends_lists() {
        let store = Store {
            egress_bytes_per_sec: 1.25e6,
            rtt_secs: 0.01,
        };
        let f = Fleet {
            edges: 3,
            store: Some(store),
            list_bytes: 1000,
            ..fleet()
        };
        let b = 512.0 * 12_288.0;
        let r = [req(0.0, 0, 0), req(10.0, 1, 0), req(10.0, 2, 0)];
        let (o, u) = simulate(&f, Mode::EdgePrompt, &r);
        assert_eq!(o[0].kv, Kv::Prefilled);
        assert_eq!((o[1].kv, o[2].kv), (Kv::Store, Kv::Store));
        // The store's egress (a tenth of the edges' link) sends one object, then the next;
        // each edge's link is done by the time its object has left the store.
        let send = b / 1.25e6;
        near(o[1].latency, send + ANSWER);
        near(o[2].latency, 2.0 * send + ANSWER);
        near(u.cloud_bytes, b + 3.0 * 1000.0);
        near(u.store_bytes, 2.0 * b);
        near(u.store_busy_secs, 2.0 * send);
        assert_eq!(u.cloud_prefills, 1);
        // A store faster than the link: the link and the store's first byte decide.
        let fast = Fleet {
            store: Some(Store {
                egress_bytes_per_sec: 1.25e9,
                ..store
            }),
            ..f
        };
        let (o, _) = simulate(&fast, Mode::EdgePrompt, &r[..2]);
        near(o[1].latency, 0.01 + b / 12.5e6 + ANSWER);
    }

    /// Edges naming every replica send each prompt to its rendezvous node: each prompt is
    /// prefilled once without any shared tier, where one node per edge prefills it on every
    /// node; prompts spread evenly and a node that goes moves only its own.
    #[test]
    fn rendezvous_homes_prefill_each_prompt_once() {
        use super::super::model::rendezvous;
        let f = Fleet {
            edges: 6,
            cloud_nodes: 3,
            ..fleet()
        };
        let r: Vec<Request> = (0..12)
            .map(|i| req(0.01 * i as f64, i % 6, i % 2))
            .collect();
        let (_, u) = simulate(&f, Mode::EdgePrompt, &r);
        assert_eq!(u.cloud_prefills, 6, "each node prefills both prompts");
        let by_prompt = Fleet {
            home: Home::Prompt,
            ..f
        };
        let (o, u) = simulate(&by_prompt, Mode::EdgePrompt, &r);
        assert_eq!(u.cloud_prefills, 2);
        assert!(o.iter().all(|o| o.latency.is_finite()));
        let mut per = [0usize; 3];
        for p in 0..600 {
            per[rendezvous(p, 3)] += 1;
            let two = rendezvous(p, 2);
            assert!(
                rendezvous(p, 3) == 2 || rendezvous(p, 3) == two,
                "{p} moved"
            );
        }
        assert!(per.iter().all(|&n| (150..=250).contains(&n)), "{per:?}");
    }

    /// Prompts held from the start: in steady state no fetch, no prefill, no byte; in a
    /// rollout a fetch each, no prefill.
    #[test]
    fn held_prompts_cost_nothing_but_a_rollouts_fetches() {
        let f = Fleet {
            prefilled: 2,
            edges_warm: true,
            ..fleet()
        };
        let r = [req(0.0, 0, 0), req(0.0, 1, 1)];
        let (o, u) = simulate(&f, Mode::EdgePrompt, &r);
        assert!(o.iter().all(|o| o.kv == Kv::Memory));
        near(o[0].latency, ANSWER);
        assert_eq!((u.cloud_prefills, u.cloud_bytes), (0, 0.0));
        let rollout = Fleet {
            edges_warm: false,
            ..f
        };
        let (o, u) = simulate(&rollout, Mode::EdgePrompt, &r[..1]);
        assert_eq!(o[0].kv, Kv::Cloud);
        near(o[0].latency, FETCH + ANSWER);
        assert_eq!(u.cloud_prefills, 0);
    }

    /// The planner's workloads follow their seed, rate and fresh share; and the plan adds cloud
    /// nodes exactly when fresh prompts keep the cloud's prefill busy.
    #[test]
    fn plans_add_cloud_nodes_when_fresh_prompts_load_the_cloud() {
        use super::super::scenario::{plan, requests, Load};
        let load = Load {
            rate: 20.0,
            secs: 100.0,
            prompts: 4,
            prompt_tokens: 512,
            fresh: 0.25,
            lengths: vec![(20, 4), (40, 8)],
            seed: 9,
            rollout: false,
        };
        let (a, pa) = requests(&load, 10);
        let (b, _) = requests(&load, 10);
        assert_eq!(a.len(), b.len());
        assert!(a
            .iter()
            .zip(&b)
            .all(|(x, y)| x.at == y.at && x.prompt == y.prompt));
        assert!((a.len() as f64 - 2000.0).abs() < 200.0, "{}", a.len());
        let fresh = pa.len() - 4;
        assert!(
            (fresh as f64 / a.len() as f64 - 0.25).abs() < 0.03,
            "{fresh}"
        );
        assert!(a.iter().all(|r| r.edge < 10 && r.prompt < pa.len()));

        // Each fresh prompt costs the cloud 0.03 + 512 * 0.0002 = 0.13 s of prefill: 5 a second
        // keep one node 66 % busy, two nodes (five edges each) 33 %. The shared prompts are
        // held before the load (a plan is for steady state): only fresh ones are prefilled.
        let f = Fleet {
            edges: 10,
            ..fleet()
        };
        let calm = Load {
            fresh: 0.0,
            ..load.clone()
        };
        let p = plan(&f, Mode::EdgePrompt, &calm, 8, 3.0, 0.5);
        assert!(p.enough && p.cloud_nodes == 1, "{p:?}");
        let p = plan(&f, Mode::EdgePrompt, &load, 8, 3.0, 0.5);
        assert!(p.enough && p.cloud_nodes == 2, "{p:?}");
        assert!(
            p.stats.cloud_busy < 0.5 && p.stats.cloud_prefills == fresh,
            "{p:?}"
        );
    }
}
