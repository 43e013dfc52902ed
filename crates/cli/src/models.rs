//! Loading models by name (the names and where files are looked for: `engine::catalog`).

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use edgeprompt_engine::{catalog, Model};

/// A model name (`smollm2`, `qwen05`, `qwen15`, `gemma3`) or a path to a GGUF file.
pub fn resolve(name: &str) -> anyhow::Result<PathBuf> {
    Ok(catalog::resolve(name)?)
}

/// `load`, with the chat template of `template` (a Jinja file) if given.
pub fn load_with(name: &str, template: Option<&std::path::Path>) -> anyhow::Result<Model> {
    let mut m = load(name)?;
    if let Some(t) = template {
        let src = std::fs::read_to_string(t)
            .with_context(|| format!("reading the chat template {}", t.display()))?;
        m.set_chat_template(&src)
            .with_context(|| format!("the chat template {}", t.display()))?;
    }
    Ok(m)
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
    // A reader that stops early (`| head`, `| grep -q`) is not an error.
    let text = serde_json::to_string_pretty(&out)?;
    match writeln!(std::io::stdout().lock(), "{text}") {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}
