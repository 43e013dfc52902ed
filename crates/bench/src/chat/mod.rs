//! `edgeprompt-bench chat`: multi-turn conversations as a chat app sends them. ShareGPT's own
//! conversations (their human turns, several each) run on a shared cloud prompt; each next turn
//! goes out after the last answer came back, carrying the whole conversation so far with the
//! server's own answers. The edge server (with its cloud node) and llama.cpp's `llama-server`
//! get the same conversations in the same run; the report is TTFT per turn and the tokens each
//! turn adds, which is what a server that keeps the conversation's KV prefills.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use edgeprompt_engine::Model;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

use crate::inputs::{resolve, sharegpt};
use crate::machine::Machine;
use crate::serve::chat;
use crate::workload::{Workload, WorkloadSpec};
use crate::BenchError;

pub mod report;

pub struct Settings {
    pub model: PathBuf,
    /// The name requests carry as `model`.
    pub model_id: String,
    pub sharegpt: PathBuf,
    /// Conversations per rate.
    pub conversations: usize,
    /// User turns per conversation.
    pub turns: usize,
    /// Distinct cloud prompts the conversations share.
    pub groups: usize,
    pub cloud_len: usize,
    /// A user turn longer than this many tokens is cut to it.
    pub turn_len: usize,
    pub max_tokens: usize,
    /// Conversations started per second (Poisson), one sweep point each.
    pub rates: Vec<f64>,
    pub seed: u64,
    pub threads: usize,
    /// Our scheduler's batch (llama-server's slots should be the same).
    pub max_batch: usize,
    pub llama_server: Option<String>,
    pub llama_server_args: Option<String>,
    pub out: PathBuf,
}

/// One turn as the client saw it.
#[derive(Debug, Clone, Serialize)]
pub struct TurnSample {
    pub server: String,
    pub rate: f64,
    pub conversation: usize,
    /// From 1.
    pub turn: usize,
    pub ttft_s: f64,
    pub total_s: f64,
    pub tokens: usize,
    /// As the server counted them: the whole conversation so far.
    pub prompt_tokens: usize,
    /// Our edge's `private_cached_tokens` (None from servers that do not say).
    pub cached_tokens: Option<usize>,
    /// Our edge's own account, from the request's arrival: admitted to the scheduler (the
    /// template, tokenizer and prompt lookup before it) and first token drawn.
    pub server_admitted_s: Option<f64>,
    pub server_ttft_s: Option<f64>,
}

/// One server, rate and turn over every conversation.
#[derive(Debug, Serialize)]
pub struct Point {
    pub server: String,
    pub rate: f64,
    pub turn: usize,
    pub done: usize,
    pub failed: usize,
    pub ttft_p50_s: f64,
    pub ttft_p99_s: f64,
    pub prompt_tokens: f64,
    /// Prompt tokens neither in the last turn's prompt nor its answer: the user's new message
    /// and the template around it (None for turn 1).
    pub new_tokens: Option<f64>,
    /// Mean `cached_tokens`, where the server reports it.
    pub cached_tokens: Option<f64>,
    /// Where our edge's median TTFT goes (means, where the server reports them): before the
    /// scheduler admits the request, from then to the first token (queue, prefill, the first
    /// draw), and from there to the client (the stream).
    pub before_admission_s: Option<f64>,
    pub admitted_to_first_s: Option<f64>,
    pub to_client_s: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub model: String,
    pub threads: usize,
    pub max_batch: usize,
    pub max_tokens: usize,
    pub conversations: usize,
    pub turns: usize,
    pub groups: usize,
    pub cloud_len: usize,
    pub turn_len: usize,
    pub seed: u64,
    pub llama_server_args: Option<String>,
    pub points: Vec<Point>,
    pub samples: Vec<TurnSample>,
}

struct Conversation {
    cloud: usize,
    users: Vec<String>,
}

/// `n` ShareGPT conversations with at least `turns` human turns each, each turn cut to
/// `turn_len` tokens, drawn without replacement in a seeded order.
fn conversations(model: &Model, s: &Settings, n: usize) -> Result<Vec<Vec<String>>, BenchError> {
    let mut all: Vec<Vec<String>> = crate::sharegpt::conversations(&s.sharegpt, 3000)?
        .into_iter()
        .map(|c| {
            c.into_iter()
                .filter(|t| t.from == "human" && !t.text.trim().is_empty())
                .map(|t| t.text)
                .take(s.turns)
                .collect::<Vec<_>>()
        })
        .filter(|h| h.len() == s.turns)
        .collect();
    if all.len() < n {
        return Err(BenchError::Data(format!(
            "{n} conversations of {} human turns asked of ShareGPT's {}",
            s.turns,
            all.len()
        )));
    }
    all.shuffle(&mut StdRng::seed_from_u64(s.seed ^ 0xc4a7));
    all.truncate(n);
    all.into_iter()
        .map(|users| {
            users
                .into_iter()
                .map(|u| {
                    let ids = model.tokenizer.encode(&u)?;
                    Ok(if ids.len() > s.turn_len {
                        model.tokenizer.decode(&ids[..s.turn_len])?
                    } else {
                        u
                    })
                })
                .collect::<Result<Vec<_>, BenchError>>()
        })
        .collect()
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let (machine, model) = crate::setup(s.threads, &s.model)?;
    // The cloud prompts: ShareGPT text as the serving benchmark cuts it.
    let spec = WorkloadSpec {
        sharegpt: s.sharegpt.clone(),
        groups: s.groups.max(1),
        per_group: 1,
        cloud_len: s.cloud_len,
        edge_len: 8,
        seed: s.seed,
    };
    let cloud = Workload::build(&model, &spec)?.cloud;
    // Fresh conversations at every rate; every server gets the same ones (its own cache).
    let mut talks = conversations(&model, s, s.conversations * s.rates.len())?.into_iter();
    let per_rate: Vec<Vec<Conversation>> = s
        .rates
        .iter()
        .map(|_| {
            (0..s.conversations)
                .map(|i| Conversation {
                    cloud: i % cloud.len(),
                    users: talks.next().unwrap_or_default(),
                })
                .collect()
        })
        .collect();
    eprintln!(
        "machine: {}; model {}; threads {}; batch {}; {} conversations × {} turns per rate on {} cloud prompts of {} tokens, user turns ≤ {} tokens, max_tokens {}",
        machine, model.cfg.name, s.threads, s.max_batch, s.conversations, s.turns, cloud.len(),
        s.cloud_len, s.turn_len, s.max_tokens
    );
    let rt = tokio::runtime::Runtime::new()?;
    let samples = rt.block_on(async {
        let servers = crate::serve::servers(
            &model,
            &s.model_id,
            &cloud,
            s.max_batch,
            s.llama_server.as_deref(),
        )
        .await?;
        let client = crate::serve::client()?;
        let mut samples = Vec::new();
        for (name, url) in &servers {
            crate::serve::warm(&client, url, &s.model_id, &cloud).await?;
            for (r, &rate) in s.rates.iter().enumerate() {
                let got = sweep(&client, name, url, s, &cloud, &per_rate[r], r, rate).await;
                report_line(name, rate, s.turns, &got);
                samples.extend(got);
            }
        }
        Ok::<_, BenchError>(samples)
    })?;
    let mut points = Vec::new();
    let servers: Vec<String> = {
        let mut v: Vec<String> = samples.iter().map(|x| x.server.clone()).collect();
        v.dedup();
        v
    };
    for server in &servers {
        for &rate in &s.rates {
            for turn in 1..=s.turns {
                points.push(point(&samples, server, rate, turn, s.conversations));
            }
        }
    }
    let report = Report {
        machine,
        model: model.cfg.name.clone(),
        threads: s.threads,
        max_batch: s.max_batch,
        max_tokens: s.max_tokens,
        conversations: s.conversations,
        turns: s.turns,
        groups: cloud.len(),
        cloud_len: s.cloud_len,
        turn_len: s.turn_len,
        seed: s.seed,
        llama_server_args: s.llama_server_args.clone(),
        points,
        samples,
    };
    crate::write_json(
        &s.out,
        &format!("chat{}.json", crate::serve::file_tag(&s.model_id)),
        &report,
    )?;
    Ok(report)
}

fn report_line(name: &str, rate: f64, turns: usize, got: &[TurnSample]) {
    let line: Vec<String> = (1..=turns)
        .map(|t| {
            let mut v: Vec<f64> = got
                .iter()
                .filter(|x| x.turn == t)
                .map(|x| x.ttft_s)
                .collect();
            v.sort_by(f64::total_cmp);
            format!("{:.3}", crate::serve::percentile(&v, 0.5))
        })
        .collect();
    eprintln!(
        "  {name:>12} {rate:5.2} conv/s: TTFT p50 per turn (s) {}",
        line.join(" ")
    );
}

/// The conversations of one rate, each started at its Poisson arrival, its turns in order.
#[allow(clippy::too_many_arguments)]
async fn sweep(
    client: &reqwest::Client,
    name: &str,
    url: &str,
    s: &Settings,
    cloud: &[String],
    talks: &[Conversation],
    r: usize,
    rate: f64,
) -> Vec<TurnSample> {
    let mut rng = StdRng::seed_from_u64(s.seed ^ rate.to_bits());
    let start = Instant::now();
    let mut at = 0.0;
    let mut tasks = Vec::new();
    for (i, c) in talks.iter().enumerate() {
        let ready = tokio::time::Instant::from_std(start + Duration::from_secs_f64(at));
        at += -(1.0 - rng.random::<f64>()).ln() / rate;
        let (client, url, model_id) = (client.clone(), url.to_string(), s.model_id.clone());
        let (system, users, name) = (cloud[c.cloud].clone(), c.users.clone(), name.to_string());
        let max_tokens = s.max_tokens;
        // A salt per conversation, as a chat app would send per user: our edge keeps KV only
        // for a caller it can tell apart.
        let salt = format!("bench-{r}-{i}");
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(ready).await;
            let mut messages = vec![json!({"role": "system", "content": system})];
            let mut out = Vec::new();
            for (k, user) in users.iter().enumerate() {
                messages.push(json!({"role": "user", "content": user}));
                let got = chat(
                    &client,
                    &url,
                    &model_id,
                    Value::Array(messages.clone()),
                    max_tokens,
                    Some(&salt),
                )
                .await;
                let (sample, text, block) = match got {
                    Ok(x) if x.0.tokens > 0 => x,
                    Ok(_) => break,
                    Err(e) => {
                        eprintln!("    {name} conversation {i} turn {}: {e}", k + 1);
                        break;
                    }
                };
                out.push(TurnSample {
                    server: name.clone(),
                    rate,
                    conversation: i,
                    turn: k + 1,
                    ttft_s: sample.ttft_s,
                    total_s: sample.total_s,
                    tokens: sample.tokens,
                    prompt_tokens: sample.prompt_tokens,
                    cached_tokens: block["private_cached_tokens"].as_u64().map(|n| n as usize),
                    server_admitted_s: block["admitted_s"].as_f64(),
                    server_ttft_s: block["ttft_s"].as_f64(),
                });
                messages.push(json!({"role": "assistant", "content": text}));
            }
            out
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        if let Ok(v) = t.await {
            all.extend(v);
        }
    }
    all
}

fn point(samples: &[TurnSample], server: &str, rate: f64, turn: usize, asked: usize) -> Point {
    let at = |t: usize| {
        samples
            .iter()
            .filter(move |x| x.server == server && x.rate == rate && x.turn == t)
    };
    let mine: Vec<&TurnSample> = at(turn).collect();
    let mut ttft: Vec<f64> = mine.iter().map(|x| x.ttft_s).collect();
    ttft.sort_by(f64::total_cmp);
    let n = mine.len().max(1) as f64;
    let new: Vec<f64> = mine
        .iter()
        .filter_map(|x| {
            at(turn.wrapping_sub(1))
                .find(|p| p.conversation == x.conversation)
                .map(|p| x.prompt_tokens as f64 - (p.prompt_tokens + p.tokens) as f64)
        })
        .collect();
    let cached: Vec<usize> = mine.iter().filter_map(|x| x.cached_tokens).collect();
    let mean = |f: &dyn Fn(&TurnSample) -> Option<f64>| {
        let v: Vec<f64> = mine.iter().filter_map(|x| f(x)).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    Point {
        server: server.into(),
        rate,
        turn,
        done: mine.len(),
        failed: asked - mine.len(),
        ttft_p50_s: crate::serve::percentile(&ttft, 0.5),
        ttft_p99_s: crate::serve::percentile(&ttft, 0.99),
        prompt_tokens: mine.iter().map(|x| x.prompt_tokens as f64).sum::<f64>() / n,
        new_tokens: (!new.is_empty()).then(|| new.iter().sum::<f64>() / new.len() as f64),
        cached_tokens: (!cached.is_empty())
            .then(|| cached.iter().sum::<usize>() as f64 / cached.len() as f64),
        before_admission_s: mean(&|x| x.server_admitted_s),
        admitted_to_first_s: mean(&|x| Some(x.server_ttft_s? - x.server_admitted_s?)),
        to_client_s: mean(&|x| Some(x.ttft_s - x.server_ttft_s?)),
    }
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// Conversations started per second (Poisson), one sweep point each.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.5")]
    rates: Vec<f64>,
    /// Conversations per rate, each with its own ShareGPT conversation.
    #[arg(long, default_value_t = 8)]
    conversations: usize,
    /// User turns per conversation.
    #[arg(long, default_value_t = 4)]
    turns: usize,
    /// Distinct cloud prompts the conversations share.
    #[arg(long, default_value_t = 2)]
    groups: usize,
    #[arg(long, default_value_t = 512)]
    cloud_len: usize,
    /// A user turn is cut to this many tokens.
    #[arg(long, default_value_t = 128)]
    turn_len: usize,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Our edge's batch; llama-server's slots should be the same (scripts/bench_serve.sh).
    #[arg(long, default_value_t = 8)]
    max_batch: usize,
    /// llama.cpp's OpenAI-compatible server on the same GGUF (scripts/bench_serve.sh starts one).
    #[arg(long)]
    llama_server: Option<String>,
    #[arg(long)]
    llama_server_args: Option<String>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench chat`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let s = Settings {
        model: resolve(&a.model)?,
        model_id: a.model.clone(),
        sharegpt: sharegpt()?,
        conversations: a.conversations.max(1),
        turns: a.turns.max(1),
        groups: a.groups.max(1),
        cloud_len: a.cloud_len,
        turn_len: a.turn_len.max(1),
        max_tokens: a.max_tokens,
        rates: a.rates,
        seed: a.seed,
        threads: a.threads,
        max_batch: a.max_batch.max(1),
        llama_server: a.llama_server,
        llama_server_args: a.llama_server_args,
        out: a.out.clone(),
    };
    let r = run(&s)?;
    eprintln!(
        "wrote {} turns to {}/chat{}.json",
        r.samples.len(),
        a.out.display(),
        crate::serve::file_tag(&s.model_id)
    );
    Ok(())
}
