//! `edgeprompt-bench fuser`: does the small model answer better with fused KV? On held-out
//! conversations (any file in ShareGPT's format): the earlier turns are the cloud prompt, the
//! next user turn private, the real answer scored token by token. Per configuration (LLM
//! alone, SLM alone, SLM with the fused KV the cloud serves, SLM with the adapters' mapped deep
//! layers): perplexity, top-1 agreement with each model alone, and exact match on a
//! multiple-choice task built from the same conversations: which of the real answer and the
//! answers of the next cases (other conversations), each cut to the same length (the shortest
//! option's, at most `CHOICE_TOKENS`), the model finds most likely after the prompt and the
//! private turn.
//!
//! Per case, the paired per-token difference from SLM alone and its standard error: a case is
//! "worse beyond noise" when the fused KV raises its mean loss by more than two standard
//! errors (the engine is deterministic, so a rerun gives the same bits: the noise that matters
//! is which tokens the answer happens to hold).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use edgeprompt_align::conversation::{answer_logits, cases, nll, prefix_of, Case, Limits};
use edgeprompt_align::{AdapterSet, Fuser};
use edgeprompt_engine::{LayerKv, Model};
use serde::{Deserialize, Serialize};

use crate::inputs::{resolve, sharegpt};
use crate::BenchError;

/// Tokens of each multiple-choice option compared (all options cut to one length).
const CHOICE_TOKENS: usize = 32;

pub struct Settings {
    pub llm: PathBuf,
    pub slm: PathBuf,
    pub fuser: PathBuf,
    /// Adapters for today's mapped layers (compared from `mapped_split` on), if any.
    pub adapters: Option<PathBuf>,
    pub mapped_split: usize,
    pub conversations: PathBuf,
    pub first_record: usize,
    pub cases: usize,
    pub limits: Limits,
    /// Options per multiple-choice question (the real answer and distractors).
    pub choices: usize,
    /// Cases whose TTFT and bytes are measured over loopback gRPC through this link profile
    /// (fused vs EdgePrompt mode); 0: none.
    pub wire_cases: usize,
    pub profile: String,
    pub threads: usize,
    pub out: PathBuf,
}

/// One cloud prompt's TTFT and bytes down, fused vs EdgePrompt mode (a cloud running the
/// edge's model), through the same shaped link.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireRow {
    pub record: usize,
    pub cloud_tokens: usize,
    pub private_tokens: usize,
    pub profile: String,
    /// First fetch: the cloud computes (and, fused, fuses) the prompt.
    pub fused_cold_s: f64,
    pub exact_cold_s: f64,
    /// Median of three later fetches: the cloud's cached KV.
    pub fused_warm_s: f64,
    pub exact_warm_s: f64,
    pub fused_bytes: usize,
    pub exact_bytes: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    pub name: String,
    pub perplexity: f64,
    pub agree_slm: f64,
    pub agree_llm: f64,
    pub choice_exact: f64,
    pub tokens: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaseRow {
    pub record: usize,
    pub cloud_tokens: usize,
    pub answer_tokens: usize,
    /// Mean loss per answer token: SLM alone, fused, LLM alone.
    pub slm_nll: f64,
    pub fused_nll: f64,
    pub llm_nll: f64,
    /// Standard error of the mean paired difference fused - SLM alone.
    pub diff_se: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: crate::machine::Machine,
    pub llm: String,
    pub slm: String,
    pub fuser: String,
    pub fuser_training: serde_json::Value,
    /// Layers whose gates are not zero.
    pub fused_layers: Vec<usize>,
    pub conversations: String,
    pub first_record: usize,
    pub cases: usize,
    pub choices: usize,
    pub configs: Vec<Config>,
    pub per_case: Vec<CaseRow>,
    /// Share of the SLM-to-LLM perplexity gap the fused KV closes.
    pub gap_closed: f64,
    /// Cases whose loss the fused KV raised by more than two standard errors.
    pub worse_beyond_noise: usize,
    /// Bytes of the prompt KV an edge receives (f16, every layer), fused and exact: the same.
    pub kv_bytes_fused: usize,
    pub kv_bytes_exact: usize,
    pub wire: Vec<WireRow>,
    pub secs: f64,
}

/// Per answer token of one configuration: loss and argmax.
struct Scored {
    nll: Vec<f64>,
    argmax: Vec<u32>,
}

fn score(
    model: &Model,
    layers: &[Arc<LayerKv>],
    c: &Case,
    answer: &[u32],
) -> Result<Scored, BenchError> {
    let logits = answer_logits(model, layers, c.cloud.len(), &c.private, answer)?;
    let v = model.cfg.vocab_size;
    let mut s = Scored {
        nll: Vec::new(),
        argmax: Vec::new(),
    };
    for (row, &t) in logits.chunks_exact(v).zip(answer) {
        s.nll.push(nll(row, t));
        s.argmax.push(edgeprompt_engine::sample::argmax(row));
    }
    Ok(s)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// The options of case `i`: its answer first, then the answers of the next cases, up to `k`
/// in all, each cut to the shortest one's length (at most `CHOICE_TOKENS`).
fn options(all: &[Case], i: usize, k: usize) -> Vec<Vec<u32>> {
    let mut out = vec![all[i].answer.clone()];
    for d in 1..all.len() {
        if out.len() == k {
            break;
        }
        let o = &all[(i + d) % all.len()].answer;
        if !out.contains(o) {
            out.push(o.clone());
        }
    }
    let n = out
        .iter()
        .map(Vec::len)
        .min()
        .unwrap_or(0)
        .min(CHOICE_TOKENS);
    out.iter_mut().for_each(|o| o.truncate(n));
    out
}

#[derive(Default)]
struct Tally {
    nll: Vec<f64>,
    agree_slm: usize,
    agree_llm: usize,
    exact: usize,
    questions: usize,
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let start = Instant::now();
    let (machine, llm) = crate::setup(s.threads, &s.llm)?;
    let slm = Arc::new(Model::load(&s.slm)?);
    eprintln!("{}", super::describe(&machine, &llm, &slm, s.threads));
    let fuser = Fuser::load(&s.fuser)?;
    fuser.check(&llm, &slm)?;
    let adapters = match &s.adapters {
        Some(p) => {
            let a = AdapterSet::load(p)?;
            if a.meta.slm_fingerprint != slm.fingerprint
                || a.meta.llm_fingerprint != llm.fingerprint
            {
                return Err(BenchError::Data(format!(
                    "{} was fitted for other models",
                    p.display()
                )));
            }
            if s.mapped_split < a.min_split() {
                return Err(BenchError::Data(format!(
                    "the adapters map layers {}.. only",
                    a.min_split()
                )));
            }
            Some(a)
        }
        None => None,
    };
    let all = cases(
        &llm,
        &slm,
        &s.conversations,
        s.first_record,
        s.cases,
        s.limits,
    )?;
    if all.len() < s.cases {
        return Err(BenchError::Data(format!(
            "found {} cases in {}, {} asked",
            all.len(),
            s.conversations.display(),
            s.cases
        )));
    }
    eprintln!(
        "{} held-out conversations (records {}..), fuser {} (layers {:?} fused)",
        all.len(),
        s.first_record,
        s.fuser.display(),
        fuser.fused_layers()
    );
    let mut names = vec![
        "LLM alone".to_string(),
        "SLM alone".into(),
        "SLM + fused KV".into(),
    ];
    if adapters.is_some() {
        names.push(format!(
            "SLM + mapped layers {}..{}",
            s.mapped_split, slm.cfg.n_layer
        ));
    }
    let mut tallies: Vec<Tally> = names.iter().map(|_| Tally::default()).collect();
    let mut per_case = Vec::new();
    let (mut bytes_fused, mut bytes_exact) = (0, 0);
    for (ci, c) in all.iter().enumerate() {
        let lp = prefix_of(&llm, &c.cloud)?;
        let sp = prefix_of(&slm, &c.cloud)?;
        let fused: Vec<Arc<LayerKv>> = fuser
            .fuse(&llm, &slm, &lp.layers, &sp.layers)?
            .into_iter()
            .map(Arc::new)
            .collect();
        bytes_fused += fused.iter().map(|l| l.bytes()).sum::<usize>();
        bytes_exact += sp.layers.iter().map(|l| l.bytes()).sum::<usize>();
        // Per configuration: the model and the prompt KV it answers after.
        let mut runs: Vec<(&Model, Vec<Arc<LayerKv>>)> = vec![
            (&llm, lp.layers.clone()),
            (&slm, sp.layers.clone()),
            (&slm, fused),
        ];
        if let Some(a) = &adapters {
            let mut layers = sp.layers.clone();
            for (j, l) in layers.iter_mut().enumerate().skip(s.mapped_split) {
                let i = a
                    .llm_layer(j)
                    .ok_or_else(|| BenchError::Data(format!("no adapter for layer {j}")))?;
                *l = Arc::new(a.map_layer(&llm, j, &lp.layers[i])?);
            }
            runs.push((&slm, layers));
        }
        let scored: Vec<Scored> = runs
            .iter()
            .map(|(m, layers)| score(m, layers, c, &c.answer))
            .collect::<Result<_, _>>()?;
        let opts = options(&all, ci, s.choices);
        for (k, ((m, layers), sc)) in runs.iter().zip(&scored).enumerate() {
            let t = &mut tallies[k];
            t.nll.extend(&sc.nll);
            for (i, a) in sc.argmax.iter().enumerate() {
                t.agree_llm += usize::from(*a == scored[0].argmax[i]);
                t.agree_slm += usize::from(*a == scored[1].argmax[i]);
            }
            if opts.len() > 1 {
                let n = opts[0].len();
                let mut best = (sc.nll[..n].iter().sum::<f64>(), 0);
                for (o, opt) in opts.iter().enumerate().skip(1) {
                    let l: f64 = score(m, layers, c, opt)?.nll.iter().sum();
                    if l < best.0 {
                        best = (l, o);
                    }
                }
                t.exact += usize::from(best.1 == 0);
                t.questions += 1;
            }
        }
        let d: Vec<f64> = scored[2]
            .nll
            .iter()
            .zip(&scored[1].nll)
            .map(|(f, s)| f - s)
            .collect();
        let md = mean(&d);
        let var = d.iter().map(|x| (x - md).powi(2)).sum::<f64>() / (d.len().max(2) - 1) as f64;
        per_case.push(CaseRow {
            record: c.record,
            cloud_tokens: c.cloud.len(),
            answer_tokens: c.answer.len(),
            slm_nll: mean(&scored[1].nll),
            fused_nll: mean(&scored[2].nll),
            llm_nll: mean(&scored[0].nll),
            diff_se: (var / d.len().max(1) as f64).sqrt(),
        });
        let r = per_case.last().expect("just pushed");
        eprintln!(
            "  case {}/{} (record {}): loss SLM {:.3} fused {:.3} LLM {:.3} ({:.0} s)",
            ci + 1,
            all.len(),
            c.record,
            r.slm_nll,
            r.fused_nll,
            r.llm_nll,
            start.elapsed().as_secs_f64()
        );
    }
    let configs: Vec<Config> = names
        .into_iter()
        .zip(&tallies)
        .map(|(name, t)| {
            let n = t.nll.len().max(1) as f64;
            Config {
                name,
                perplexity: mean(&t.nll).exp(),
                agree_slm: t.agree_slm as f64 / n,
                agree_llm: t.agree_llm as f64 / n,
                choice_exact: t.exact as f64 / t.questions.max(1) as f64,
                tokens: t.nll.len(),
            }
        })
        .collect();
    let (pl, ps, pf) = (
        configs[0].perplexity,
        configs[1].perplexity,
        configs[2].perplexity,
    );
    let wire = match s.wire_cases {
        0 => Vec::new(),
        n => wire(
            &llm,
            &slm,
            Fuser::load(&s.fuser)?,
            &all[..n.min(all.len())],
            &s.profile,
        )?,
    };
    let report = Report {
        machine,
        llm: llm.cfg.name.clone(),
        slm: slm.cfg.name.clone(),
        fuser: s.fuser.display().to_string(),
        fuser_training: fuser.meta.training.clone(),
        fused_layers: fuser.fused_layers(),
        conversations: s.conversations.display().to_string(),
        first_record: s.first_record,
        cases: all.len(),
        choices: s.choices,
        gap_closed: (ps - pf) / (ps - pl),
        worse_beyond_noise: per_case
            .iter()
            .filter(|r| r.fused_nll - r.slm_nll > 2.0 * r.diff_se)
            .count(),
        configs,
        per_case,
        kv_bytes_fused: bytes_fused,
        kv_bytes_exact: bytes_exact,
        wire,
        secs: start.elapsed().as_secs_f64(),
    };
    println!(
        "{:<32} {:>10} {:>10} {:>10} {:>12}",
        "configuration", "perplexity", "agree SLM", "agree LLM", "choice exact"
    );
    for c in &report.configs {
        println!(
            "{:<32} {:>10.3} {:>9.1}% {:>9.1}% {:>11.1}%",
            c.name,
            c.perplexity,
            100.0 * c.agree_slm,
            100.0 * c.agree_llm,
            100.0 * c.choice_exact
        );
    }
    println!(
        "gap closed {:.1} %; {} of {} cases worse than SLM alone beyond 2 standard errors",
        100.0 * report.gap_closed,
        report.worse_beyond_noise,
        report.cases
    );
    crate::write_json(&s.out, "fuser.json", &report)?;
    Ok(report)
}

/// TTFT (fetch, private prefill, first token) and bytes down for `c` from the cloud at `url`,
/// asking for fused KV or not.
async fn ttft(
    slm: &Arc<Model>,
    url: &str,
    id: &str,
    private: &[u32],
    fused: bool,
) -> Result<(f64, usize), BenchError> {
    let start = Instant::now();
    let mut client = edgeprompt_edge::CloudClient::connect(url)
        .await?
        .accepting_fused(fused);
    let (header, mut rx) = client
        .fetch(
            slm,
            edgeprompt_protocol::PromptRef::Id(id.into()),
            &[edgeprompt_kv::Codec::F16],
            false,
        )
        .await?;
    if header.fuser.is_empty() == fused {
        return Err(BenchError::Data(format!(
            "asked fused: {fused}, the header's fuser: {:?}",
            header.fuser
        )));
    }
    let (m, ids) = (slm.clone(), private.to_vec());
    tokio::task::spawn_blocking(move || {
        let (_, logits, tl) =
            edgeprompt_edge::prefill_from_cloud(&m, &header, &mut rx, &ids, start, true)?;
        let _ = edgeprompt_engine::sample::argmax(&logits);
        Ok((start.elapsed().as_secs_f64(), tl.bytes_down()))
    })
    .await
    .map_err(|e| BenchError::Data(e.to_string()))?
}

/// Fused vs EdgePrompt mode on the wire: a cloud running the LLM with the fuser, one running
/// the SLM, both on loopback behind the same link profile.
fn wire(
    llm: &Arc<Model>,
    slm: &Arc<Model>,
    fuser: Fuser,
    cases: &[Case],
    profile: &str,
) -> Result<Vec<WireRow>, BenchError> {
    use edgeprompt_cloud::{CloudNode, PromptSpec};
    let p = edgeprompt_link::Profile::named(profile)
        .ok_or_else(|| BenchError::Data(format!("unknown profile {profile}")))?;
    let specs: Vec<PromptSpec> = cases
        .iter()
        .map(|c| PromptSpec {
            id: format!("r{}", c.record),
            system: c.system.clone(),
            text: None,
        })
        .collect();
    let fused_node =
        CloudNode::new(llm.clone(), &specs, 4 << 30)?.with_fuser(slm.clone(), fuser)?;
    let exact_node = CloudNode::new(slm.clone(), &specs, 4 << 30)?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let mut rows = Vec::new();
        let fa = crate::nodes::serve(Arc::new(fused_node)).await?;
        let ea = crate::nodes::serve(Arc::new(exact_node)).await?;
        let fl = edgeprompt_link::Link::start("127.0.0.1:0", fa.to_string(), p).await?;
        let el = edgeprompt_link::Link::start("127.0.0.1:0", ea.to_string(), p).await?;
        let (fu, eu) = (format!("http://{}", fl.addr), format!("http://{}", el.addr));
        for c in cases {
            let id = format!("r{}", c.record);
            let (fused_cold_s, _) = ttft(slm, &fu, &id, &c.private, true).await?;
            let (exact_cold_s, _) = ttft(slm, &eu, &id, &c.private, false).await?;
            let (mut fw, mut ew) = (Vec::new(), Vec::new());
            let (mut fb, mut eb) = (0, 0);
            for _ in 0..3 {
                let (t, b) = ttft(slm, &fu, &id, &c.private, true).await?;
                fw.push(t);
                fb = b;
                let (t, b) = ttft(slm, &eu, &id, &c.private, false).await?;
                ew.push(t);
                eb = b;
            }
            fw.sort_by(f64::total_cmp);
            ew.sort_by(f64::total_cmp);
            let row = WireRow {
                record: c.record,
                cloud_tokens: c.cloud.len(),
                private_tokens: c.private.len(),
                profile: profile.to_string(),
                fused_cold_s,
                exact_cold_s,
                fused_warm_s: fw[1],
                exact_warm_s: ew[1],
                fused_bytes: fb,
                exact_bytes: eb,
            };
            eprintln!(
                "  wire {profile}, record {}: TTFT fused {:.3} s (cold {:.3}), EdgePrompt {:.3} s (cold {:.3}); bytes {} vs {}",
                c.record, row.fused_warm_s, row.fused_cold_s, row.exact_warm_s, row.exact_cold_s, fb, eb
            );
            rows.push(row);
        }
        Ok::<_, BenchError>(rows)
    })
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "qwen15")]
    llm: String,
    #[arg(long, default_value = "qwen05")]
    slm: String,
    /// The fuser `scripts/fuser/train.py` wrote.
    #[arg(long, default_value = "models/fuser/fuser.safetensors")]
    fuser: PathBuf,
    /// Adapters from `edgeprompt align`, to compare today's mapped layers (skipped if absent).
    #[arg(long, default_value = "models/align/adapters.safetensors")]
    adapters: PathBuf,
    /// The mapped layers compared start here (the split the quality floor allows).
    #[arg(long, default_value_t = 18)]
    mapped_split: usize,
    /// Conversations in ShareGPT's format (default: the packaged ShareGPT).
    #[arg(long)]
    conversations: Option<PathBuf>,
    /// First record used: 4000 holds out the cases `bench lslm` scores (its 8 first), apart
    /// from calibration and from the fuser's training data (records 10000..).
    #[arg(long, default_value_t = 4000)]
    first_record: usize,
    #[arg(long, default_value_t = 72)]
    cases: usize,
    #[arg(long, default_value_t = 512)]
    cloud_tokens: usize,
    #[arg(long, default_value_t = 96)]
    user_tokens: usize,
    #[arg(long, default_value_t = 96)]
    answer_tokens: usize,
    /// Options per multiple-choice question.
    #[arg(long, default_value_t = 4)]
    choices: usize,
    /// Cases whose TTFT and bytes are measured on loopback gRPC, fused vs EdgePrompt mode.
    #[arg(long, default_value_t = 4)]
    wire_cases: usize,
    /// Link profile for those measurements.
    #[arg(long, default_value = "wifi")]
    profile: String,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench fuser`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    if !a.fuser.exists() {
        return Err(BenchError::Failed(format!(
            "{} missing: run `edgeprompt fuser-data` and scripts/fuser/train.py first",
            a.fuser.display()
        )));
    }
    if a.cases == 0 || a.choices == 0 {
        return Err(BenchError::Failed(
            "--cases and --choices are at least 1".into(),
        ));
    }
    let s = Settings {
        llm: resolve(&a.llm)?,
        slm: resolve(&a.slm)?,
        fuser: a.fuser,
        adapters: a.adapters.exists().then_some(a.adapters),
        mapped_split: a.mapped_split,
        conversations: match a.conversations {
            Some(p) => p,
            None => sharegpt()?,
        },
        first_record: a.first_record,
        cases: a.cases,
        limits: edgeprompt_align::conversation::Limits {
            cloud_tokens: a.cloud_tokens,
            user_tokens: a.user_tokens,
            answer_tokens: a.answer_tokens,
        },
        choices: a.choices,
        wire_cases: a.wire_cases,
        profile: a.profile,
        threads: a.threads,
        out: a.out.clone(),
    };
    run(&s)?;
    eprintln!("wrote {}/fuser.json", a.out.display());
    Ok(())
}
