//! Token sampling: greedy, temperature, top-k, top-p, seeded.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::grammar::{Constraint, GrammarError};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means no top-k cut.
    pub top_k: usize,
    /// 1.0 means no nucleus cut.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = StdRng::seed_from_u64(params.seed);
        Self { params, rng }
    }

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.temperature <= 0.0 {
            return argmax(logits);
        }
        let t = self.params.temperature;
        // Only tokens within `WEIGHT_CUTOFF * t` of the top logit are ranked: the others'
        // weights are under 2^-26 of the top one's, too small to move any f32 sum below (each
        // is under half an ulp of a running sum the top token starts), so the draw is the
        // one a sort of the whole vocabulary gives (Qwen's 152k: 7 ms a token, on the
        // scheduler's thread, for every request with a temperature). NaN stays in the race.
        let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let floor = top - WEIGHT_CUTOFF * t;
        // (logit, id) pairs: sorting them reads no logit through an index.
        let mut ranked: Vec<(f32, u32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, &l)| l >= floor || l.is_nan())
            .map(|(i, &l)| (l, i as u32))
            .collect();
        // Highest logit first, the lower id first on a tie.
        let order = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        let k = self.params.top_k;
        if k > 0 && k < ranked.len() {
            ranked.select_nth_unstable_by(k - 1, order);
            ranked.truncate(k);
        }
        ranked.sort_unstable_by(order);
        let max = ranked[0].0;
        let mut p: Vec<f32> = ranked.iter().map(|&(l, _)| ((l - max) / t).exp()).collect();
        let total: f32 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= total);
        if self.params.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = p.len();
            for (i, x) in p.iter().enumerate() {
                cum += x;
                if cum >= self.params.top_p {
                    keep = i + 1;
                    break;
                }
            }
            p.truncate(keep);
        }
        let total: f32 = p.iter().sum();
        let mut r = self.rng.random::<f32>() * total;
        for (i, x) in p.iter().enumerate() {
            if r < *x {
                return ranked[i].1;
            }
            r -= x;
        }
        ranked[p.len() - 1].1
    }
}

/// Each sampler's draw from its logits (through its grammar's mask, when it has one), the
/// batch cut over the pool: a draw at a temperature is 0.1-4 ms and a grammar's mask about as
/// much, and each sampler has its own generator and grammar, so the cut changes no draw.
pub fn sample_each(draws: Vec<Draw<'_>>) -> Vec<std::result::Result<u32, GrammarError>> {
    let mut jobs: Vec<(Draw<'_>, Option<std::result::Result<u32, GrammarError>>)> =
        draws.into_iter().map(|d| (d, None)).collect();
    crate::par::each(&mut jobs, 2, &|_, (d, out)| {
        *out = Some(draw(d.sampler, d.constraint.as_deref_mut(), d.logits))
    });
    jobs.into_iter()
        .map(|(_, out)| out.unwrap_or(Err(GrammarError::Failed("not drawn".into()))))
        .collect()
}

/// One row's next token: `sampler`'s draw from `logits`, through `constraint`'s mask when
/// there is one.
pub fn draw(
    sampler: &mut Sampler,
    constraint: Option<&mut Constraint>,
    logits: &[f32],
) -> std::result::Result<u32, GrammarError> {
    match constraint {
        Some(c) => c.draw(sampler, logits),
        None => Ok(sampler.sample(logits)),
    }
}

/// One row's draw: its sampler, its grammar (if any) and its logits.
pub struct Draw<'a> {
    pub sampler: &'a mut Sampler,
    pub constraint: Option<&'a mut Constraint>,
    pub logits: &'a [f32],
}

/// Logits this many temperatures below the top one carry weight `e^-18.5` < 2^-26.
const WEIGHT_CUTOFF: f32 = 18.5;

/// A sampled token's log-probability under the model, with the most likely alternatives'.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub id: u32,
    pub logprob: f32,
    /// `(id, logprob)`, most likely first (the lower id first on a tie).
    pub top: Vec<(u32, f32)>,
}

/// Log-softmax of the raw logits (before temperature or truncation: what OpenAI and vLLM
/// report) at `id` and at the `top` largest logits. The normaliser is summed in f64.
pub fn logprobs(logits: &[f32], id: u32, top: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&x| f64::from(x - max).exp()).sum();
    let lse = f64::from(max) + sum.ln();
    let lp = |i: u32| (f64::from(logits[i as usize]) - lse) as f32;
    if top == 0 {
        return TokenLogprobs {
            id,
            logprob: lp(id),
            top: Vec::new(),
        };
    }
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let order = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let top = top.min(idx.len());
    if top > 0 && top < idx.len() {
        idx.select_nth_unstable_by(top - 1, order);
    }
    idx.truncate(top);
    idx.sort_by(order);
    TokenLogprobs {
        id,
        logprob: lp(id),
        top: idx.into_iter().map(|i| (i, lp(i))).collect(),
    }
}

/// Index of the largest logit; the lowest index wins a tie.
pub fn argmax(logits: &[f32]) -> u32 {
    argmax_by_lanes(logits)
}

/// The index `argmax_scalar` gives, in two passes the compiler vectorizes: the largest value
/// by eight running maxima (a maximum does not depend on the order; NaN never wins), then
/// its first position. The scalar loop's compare-and-branch per logit was ~2 % of a batch-32
/// decode step.
fn argmax_by_lanes(logits: &[f32]) -> u32 {
    let Some(&first) = logits.first() else {
        return 0;
    };
    if first.is_nan() {
        // Nothing is greater than NaN: the scalar loop keeps index 0.
        return 0;
    }
    let mut lanes = [first; 8];
    let mut chunks = logits.chunks_exact(8);
    for c in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    let mut top = first;
    for &x in lanes.iter().chain(chunks.remainder()) {
        top = if x > top { x } else { top };
    }
    // The first value equal to the maximum is where the scalar loop stopped raising it (its
    // zeros of either sign compare equal, and the first of them is the one it kept).
    logits.iter().position(|&x| x == top).unwrap_or(0) as u32
}

/// The definition: the first index of the largest value, NaN never larger.
#[cfg(test)]
fn argmax_scalar(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_first_maximum() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn argmax_by_lanes_is_the_scalar_loop() {
        let nan = f32::NAN;
        let cases: Vec<Vec<f32>> = vec![
            vec![],
            vec![nan, 1.0, 2.0],
            vec![1.0, nan, 3.0, nan],
            vec![-1.0, -0.0, 0.0, -2.0],
            vec![-1.0, 0.0, -0.0],
            vec![f32::NEG_INFINITY; 19],
            (0..1000).map(|i| ((i * 7919) % 997) as f32).collect(),
            (0..37)
                .map(|i| if i % 5 == 0 { nan } else { (i % 7) as f32 })
                .collect(),
            (0..64).map(|i| -((i % 9) as f32)).collect(),
        ];
        for c in &cases {
            assert_eq!(argmax_by_lanes(c), argmax_scalar(c), "{c:?}");
        }
    }

    #[test]
    fn top_k_one_is_greedy_and_seed_repeats() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32).collect();
        let p = |top_k, seed| SamplingParams {
            temperature: 1.0,
            top_k,
            top_p: 1.0,
            seed,
        };
        assert_eq!(Sampler::new(p(1, 3)).sample(&logits), argmax(&logits));
        let draw = |seed| {
            let mut s = Sampler::new(p(0, seed));
            (0..20).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
    }

    #[test]
    fn logprobs_are_a_normalised_log_softmax_with_the_top_in_order() {
        let logits: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 997) as f32 / 50.0)
            .collect();
        let all: Vec<f32> = (0..1000u32)
            .map(|i| logprobs(&logits, i, 0).logprob)
            .collect();
        let total: f64 = all.iter().map(|&x| f64::from(x).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5, "{total}");
        let t = logprobs(&logits, 3, 5);
        assert_eq!(t.logprob, all[3]);
        assert_eq!(t.top.len(), 5);
        assert_eq!(t.top[0].0, argmax(&logits));
        assert!(t.top.windows(2).all(|w| w[0].1 >= w[1].1));
        assert!(t.top.iter().all(|&(i, lp)| lp == all[i as usize]));
    }

    /// The sampler before the cut: every token ranked.
    fn sample_ranking_all(params: &SamplingParams, rng: &mut StdRng, logits: &[f32]) -> u32 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        // Ties by id, so that which of equal logits make the top k is defined.
        let by_logit = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        let k = params.top_k;
        if k > 0 && k < idx.len() {
            idx.select_nth_unstable_by(k - 1, by_logit);
            idx.truncate(k);
        }
        idx.sort_by(by_logit);
        let t = params.temperature;
        let max = logits[idx[0] as usize];
        let mut p: Vec<f32> = idx
            .iter()
            .map(|&i| ((logits[i as usize] - max) / t).exp())
            .collect();
        let total: f32 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= total);
        if params.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = p.len();
            for (i, x) in p.iter().enumerate() {
                cum += x;
                if cum >= params.top_p {
                    keep = i + 1;
                    break;
                }
            }
            p.truncate(keep);
        }
        let total: f32 = p.iter().sum();
        let mut r = rng.random::<f32>() * total;
        for (i, x) in p.iter().enumerate() {
            if r < *x {
                return idx[i];
            }
            r -= x;
        }
        idx[p.len() - 1]
    }

    #[test]
    fn ranking_only_the_weighty_tokens_draws_what_ranking_all_did() {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 40) as f32 / 16_777_216.0
        };
        let n = 5000;
        let shapes: Vec<Vec<f32>> = vec![
            (0..n).map(|_| next() * 40.0 - 20.0).collect(),
            (0..n).map(|_| next() * 4.0).collect(),
            (0..n)
                .map(|i| if i % 97 == 0 { 12.0 } else { next() * 3.0 })
                .collect(),
            (0..n).map(|i| ((i * 7919) % 13) as f32).collect(),
            (0..n).map(|_| (next() * 8.0).round()).collect(),
        ];
        for logits in &shapes {
            for (temperature, top_k, top_p) in [
                (1.0, 0, 1.0),
                (0.3, 0, 1.0),
                (2.0, 0, 1.0),
                (1.0, 0, 0.9),
                (0.7, 50, 0.95),
            ] {
                let params = SamplingParams {
                    temperature,
                    top_k,
                    top_p,
                    seed: 11,
                };
                let mut fast = Sampler::new(params.clone());
                let mut rng = StdRng::seed_from_u64(params.seed);
                for draw in 0..200 {
                    assert_eq!(
                        fast.sample(logits),
                        sample_ranking_all(&params, &mut rng, logits),
                        "t {temperature} k {top_k} p {top_p}, draw {draw}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_batch_drawn_together_draws_what_each_sampler_draws_alone() {
        let logits: Vec<Vec<f32>> = (0..6)
            .map(|s| {
                (0..3000)
                    .map(|i| ((i * 7919 + s * 31) % 1009) as f32 / 90.0)
                    .collect()
            })
            .collect();
        let params = |seed| SamplingParams {
            temperature: 0.9,
            top_k: 0,
            top_p: 0.95,
            seed,
        };
        let mut together: Vec<Sampler> = (0..6).map(|s| Sampler::new(params(s))).collect();
        let mut alone: Vec<Sampler> = (0..6).map(|s| Sampler::new(params(s))).collect();
        for _ in 0..5 {
            let draws = together.iter_mut().zip(&logits).map(|(s, l)| Draw {
                sampler: s,
                constraint: None,
                logits: &l[..],
            });
            let got: Vec<u32> = sample_each(draws.collect())
                .into_iter()
                .map(|r| r.unwrap())
                .collect();
            let want: Vec<u32> = alone
                .iter_mut()
                .zip(&logits)
                .map(|(s, l)| s.sample(l))
                .collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        // One token holds ~all the mass: a small top_p must always pick it.
        let mut logits = vec![0.0f32; 10];
        logits[7] = 20.0;
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            seed: 1,
        });
        assert!((0..50).all(|_| s.sample(&logits) == 7));
    }
}
