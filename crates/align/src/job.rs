//! The align job (`edgeprompt align --llm A --slm B`): both models run over ShareGPT
//! calibration text; every LLM layer is compared with every SLM layer by CKA and RSA (CE-LSLM
//! eqs. 12-15), the matching table is built with thresholds (eq. 16), and per matched pair
//! ridge maps from the LLM's K/V to the SLM's are fitted and saved beside `align.json` (whose
//! similarity matrices `edgeprompt-bench report` draws as the paper's Fig. 5 heat maps).

use std::path::{Path, PathBuf};
use std::time::Instant;

use edgeprompt_engine::machine::Machine;
use edgeprompt_engine::{Message, Model};
use serde::Serialize;

use crate::{
    collect, compare, fit_adapters, match_layers, AdapterSet, AlignError, FitOptions, PairInfo,
    Result, Sampling, Similarity,
};

pub struct Settings {
    pub llm: PathBuf,
    pub slm: PathBuf,
    pub sharegpt: PathBuf,
    /// Calibration sequences and tokens of text in each.
    pub sequences: usize,
    pub seq_tokens: usize,
    pub sampling: Sampling,
    pub t_cka: f64,
    pub t_rsa: f64,
    pub ridge: f64,
    /// Key-channel fractions to fit adapters for (1 = no ThinK selection).
    pub key_keeps: Vec<f64>,
    pub held_out: f64,
    pub threads: usize,
    pub out: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub llm: String,
    pub slm: String,
    pub llm_fingerprint: String,
    pub slm_fingerprint: String,
    pub calibration_sequences: usize,
    pub calibration_tokens: usize,
    pub similarity_tokens: usize,
    pub t_cka: f64,
    pub t_rsa: f64,
    pub ridge: f64,
    pub similarity: Similarity,
    /// Per SLM layer, the matched LLM layer.
    pub matches: Vec<Option<usize>>,
    /// Per adapter file: its path, ThinK keep fraction and per-pair fit.
    pub adapters: Vec<AdapterSummary>,
    pub secs: f64,
}

#[derive(Debug, Serialize)]
pub struct AdapterSummary {
    pub path: String,
    pub key_keep: f64,
    pub min_split: usize,
    pub pairs: Vec<PairInfo>,
}

/// File name of the adapters fitted with ThinK keep fraction `keep`.
pub fn adapter_file(keep: f64) -> String {
    if keep >= 1.0 {
        "adapters.safetensors".into()
    } else {
        format!("adapters-think{:02.0}.safetensors", keep * 100.0)
    }
}

/// Calibration sequences from the start of ShareGPT (the quality bench holds out later records).
pub fn calibration(
    llm: &Model,
    slm: &Model,
    sharegpt: &Path,
    sequences: usize,
    seq_tokens: usize,
) -> Result<Vec<Vec<u32>>> {
    let turns = crate::sharegpt::turns(sharegpt, 40 * sequences.max(1))?;
    let mut out = Vec::new();
    let mut text = String::new();
    for t in turns {
        text.push_str(&t);
        text.push('\n');
        if text.len() > 6 * seq_tokens {
            if let Ok(system) = cut(llm, &text, seq_tokens) {
                out.push(system_ids(llm, slm, &system)?);
            }
            text.clear();
            if out.len() == sequences {
                break;
            }
        }
    }
    if out.len() < sequences {
        return Err(AlignError::Calibration(format!(
            "ShareGPT gave {} calibration sequences of {seq_tokens} tokens, {sequences} asked",
            out.len()
        )));
    }
    Ok(out)
}

pub fn run(s: &Settings) -> Result<Report> {
    let start = Instant::now();
    let machine = edgeprompt_engine::machine::start(s.threads);
    let llm = Model::load(&s.llm)?;
    let slm = Model::load(&s.slm)?;
    eprintln!("{}", describe(&machine, &llm, &slm, s.threads));
    let seqs = calibration(&llm, &slm, &s.sharegpt, s.sequences, s.seq_tokens)?;
    let tokens: usize = seqs.iter().map(Vec::len).sum();
    eprintln!(
        "calibration: {} sequences, {tokens} tokens (ShareGPT)",
        seqs.len()
    );
    let progress = |who: &'static str| {
        move |d: usize, n: usize| {
            eprint!(
                "\r  {who}: sequence {d}/{n}{}",
                if d == n { "\n" } else { "" }
            )
        }
    };
    let llm_cal = collect(&llm, &seqs, s.sampling, progress("LLM"))?;
    let slm_cal = collect(&slm, &seqs, s.sampling, progress("SLM"))?;
    eprintln!(
        "similarity over {} sampled tokens: {} x {} layer pairs",
        llm_cal.sim_rows, llm.cfg.n_layer, slm.cfg.n_layer
    );
    let sim = compare(&llm_cal, &slm_cal)?;
    let matches = match_layers(&sim.cka, &sim.rsa, s.t_cka, s.t_rsa);
    std::fs::create_dir_all(&s.out)?;
    let mut adapters = Vec::new();
    for &keep in &s.key_keeps {
        let set = fit_adapters(
            &llm,
            &slm,
            &llm_cal,
            &slm_cal,
            &matches,
            &sim.cka,
            &sim.rsa,
            FitOptions {
                ridge: s.ridge,
                key_keep: keep,
                held_out: s.held_out,
            },
            |d, n| {
                eprint!(
                    "\r  adapters (keep {keep}): pair {d}/{n}{}",
                    if d == n { "\n" } else { "" }
                )
            },
        )?;
        let path = s.out.join(adapter_file(keep));
        set.save(&path)?;
        adapters.push(AdapterSummary {
            path: path.display().to_string(),
            key_keep: keep,
            min_split: set.min_split(),
            pairs: set.meta.pairs.clone(),
        });
    }
    let report = Report {
        machine,
        llm: llm.cfg.name.clone(),
        slm: slm.cfg.name.clone(),
        llm_fingerprint: llm.fingerprint.clone(),
        slm_fingerprint: slm.fingerprint.clone(),
        calibration_sequences: seqs.len(),
        calibration_tokens: tokens,
        similarity_tokens: sim.tokens,
        t_cka: s.t_cka,
        t_rsa: s.t_rsa,
        ridge: s.ridge,
        similarity: sim,
        matches,
        adapters,
        secs: start.elapsed().as_secs_f64(),
    };
    write_outputs(&report, &s.out)?;
    print_table(&report);
    Ok(report)
}

fn write_outputs(r: &Report, out: &Path) -> Result<()> {
    let path = out.join("align.json");
    let json = serde_json::to_string_pretty(r)
        .map_err(|e| AlignError::Calibration(format!("align.json: {e}")))?;
    std::fs::write(&path, json).map_err(|e| AlignError::File {
        path: path.display().to_string(),
        msg: e.to_string(),
    })
}

fn print_table(r: &Report) {
    println!(
        "matching table (eq. 16: CKA >= {}, RSA >= {}); adapters fitted on {} tokens",
        r.t_cka, r.t_rsa, r.calibration_tokens
    );
    println!("SLM layer | LLM layer |   CKA |   RSA | R² keys | R² values");
    let pairs = r
        .adapters
        .first()
        .map(|a| a.pairs.as_slice())
        .unwrap_or(&[]);
    for (j, m) in r.matches.iter().enumerate() {
        match (m, pairs.iter().find(|p| p.slm_layer == j)) {
            (Some(i), Some(p)) => println!(
                "{j:>9} | {i:>9} | {:.3} | {:.3} | {:>7.3} | {:>9.3}",
                p.cka, p.rsa, p.r2_keys, p.r2_values
            ),
            _ => {
                let best = (0..r.similarity.cka.len())
                    .max_by(|&a, &b| r.similarity.cka[a][j].total_cmp(&r.similarity.cka[b][j]))
                    .unwrap_or(0);
                println!(
                    "{j:>9} |         - | best {best}: CKA {:.3}, RSA {:.3} (below threshold)",
                    r.similarity.cka[best][j], r.similarity.rsa[best][j]
                );
            }
        }
    }
    for a in &r.adapters {
        println!(
            "adapters (ThinK keep {}): {} (layers {}.. can come from the cloud)",
            a.key_keep, a.path, a.min_split
        );
    }
    println!(
        "wrote align.json ({:.0} s); heat maps: edgeprompt-bench report --from <its dir> --to <its dir>/align.md",
        r.secs
    );
}

/// Load an adapter file written by `run`.
pub fn load_adapters(path: &Path) -> Result<AdapterSet> {
    AdapterSet::load(path)
}

/// The token ids of `system` as a chat's system turn, identical under both models' templates
/// and tokenizers (CE-LSLM needs one tokenizer), or an error saying they differ.
pub fn system_ids(llm: &Model, slm: &Model, system: &str) -> Result<Vec<u32>> {
    let ids = |m: &Model| -> Result<Vec<u32>> {
        let chat = m
            .chat
            .as_ref()
            .ok_or_else(|| AlignError::Calibration("model has no chat template".into()))?;
        Ok(m.tokenizer
            .encode(&chat.render(&[Message::new("system", system)], false)?)?)
    };
    let a = ids(llm)?;
    if ids(slm)? != a {
        return Err(AlignError::Calibration(
            "the two models tokenize the prompt differently: CE-LSLM needs one tokenizer".into(),
        ));
    }
    Ok(a)
}

/// The first `n` tokens of `s` as text.
pub fn cut(model: &Model, s: &str, n: usize) -> Result<String> {
    let ids = model.tokenizer.encode(s)?;
    if ids.len() < n {
        return Err(AlignError::Calibration(format!(
            "need {n} tokens of text, have {}",
            ids.len()
        )));
    }
    Ok(model.tokenizer.decode(&ids[..n])?)
}

/// The line every CE-LSLM job starts with: machine, revision, both models, threads.
pub fn describe(machine: &Machine, llm: &Model, slm: &Model, threads: usize) -> String {
    format!(
        "machine: {machine}; cloud LLM {} ({} layers), edge SLM {} ({} layers); threads {threads}",
        llm.cfg.name, llm.cfg.n_layer, slm.cfg.name, slm.cfg.n_layer,
    )
}
