//! Model names and files.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use edgeprompt_engine::Model;

/// Short names for the models `scripts/models.py` fetches.
const KNOWN: &[(&str, &str, &str)] = &[
    ("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"),
    (
        "qwen05",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen05",
    ),
    (
        "qwen15",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "qwen15",
    ),
];

/// Where model files are looked for, in order: `$EDGEPROMPT_MODELS` alone when set; else
/// `./models`, the `models/` of the checkout this binary was built in (found from the
/// executable's path, so names resolve from any working directory), and the per-user cache
/// (`$XDG_CACHE_HOME` or `~/.cache`, `edgeprompt/models`).
pub fn model_dirs() -> Vec<PathBuf> {
    if let Some(d) = std::env::var_os("EDGEPROMPT_MODELS") {
        return vec![PathBuf::from(d)];
    }
    let mut dirs = vec![PathBuf::from("models")];
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/edgeprompt: the checkout is the first ancestor with a models/.
        if let Some(d) = exe
            .ancestors()
            .skip(1)
            .map(|a| a.join("models"))
            .find(|d| d.is_dir())
        {
            dirs.push(d);
        }
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    if let Some(c) = cache {
        dirs.push(c.join("edgeprompt").join("models"));
    }
    dirs
}

/// The first of `model_dirs` that holds `file`, or an error naming every place looked.
pub fn find(file: &str, fetch: &str) -> anyhow::Result<PathBuf> {
    let dirs = model_dirs();
    if let Some(p) = dirs.iter().map(|d| d.join(file)).find(|p| p.exists()) {
        return Ok(p);
    }
    let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    bail!(
        "{file} is not in {}: run `python3 scripts/models.py {fetch}` (or set EDGEPROMPT_MODELS)",
        looked.join(", ")
    )
}

/// A model name (`smollm2`, `qwen05`, `qwen15`) or a path to a GGUF file.
pub fn resolve(name: &str) -> anyhow::Result<PathBuf> {
    if let Some((_, file, fetch)) = KNOWN.iter().find(|(n, _, _)| *n == name) {
        return find(file, fetch).with_context(|| format!("model {name}"));
    }
    let p = PathBuf::from(name);
    if !p.exists() {
        let names: Vec<_> = KNOWN.iter().map(|k| k.0).collect();
        bail!("no model file {name} (known names: {})", names.join(", "));
    }
    Ok(p)
}

pub fn load(name: &str) -> anyhow::Result<Model> {
    let path = resolve(name)?;
    let t = Instant::now();
    eprintln!("loading {} ...", path.display());
    let m = Model::load(&path).with_context(|| format!("loading {}", path.display()))?;
    eprintln!(
        "loaded {} ({}, {} layers, {:.0} MB) in {:.2} s",
        m.cfg.name,
        format!("{:?}", m.cfg.arch).to_lowercase(),
        m.cfg.n_layer,
        m.info.file_bytes as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    Ok(m)
}

#[derive(clap::Args)]
pub struct InfoArgs {
    #[arg(long, default_value = "smollm2")]
    model: String,
}

pub fn info(a: InfoArgs) -> anyhow::Result<()> {
    let m = load(&a.model)?;
    let out = serde_json::json!({
        "config": m.cfg,
        "info": m.info,
        "fingerprint": m.fingerprint,
        "kv_bytes_per_token_f16": m.cfg.kv_bytes_per_token(),
        "pre_tokenizer": m.tokenizer.pre,
        "bos": m.tokenizer.bos_id,
        "eos": m.tokenizer.eos_id,
        "stop_ids": m.tokenizer.stop_ids,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
