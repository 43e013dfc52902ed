//! Model names and where their files live: shared by the product binary and the benchmarks,
//! so `--model smollm2` means the same file to both, from any working directory.

use std::path::PathBuf;

use crate::{EngineError, Result};

/// Short names for the files `scripts/models.py` fetches: (name, file, its fetch argument).
pub const KNOWN: &[(&str, &str, &str)] = &[
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
    ("gemma3", "gemma-3-270m-q4_k_m.gguf", "gemma3"),
];

/// The ShareGPT file the calibration and the benchmarks read.
pub const SHAREGPT: (&str, &str) = ("ShareGPT_V3_unfiltered_cleaned_split.json", "sharegpt");

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

/// The first of `model_dirs` that holds `file`, or an error naming every place looked and
/// the `scripts/models.py` argument (`fetch`) that downloads it.
pub fn find(file: &str, fetch: &str) -> Result<PathBuf> {
    let dirs = model_dirs();
    if let Some(p) = dirs.iter().map(|d| d.join(file)).find(|p| p.exists()) {
        return Ok(p);
    }
    let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    Err(EngineError::Missing(format!(
        "{file} is not in {}: run `python3 scripts/models.py {fetch}` (or set EDGEPROMPT_MODELS)",
        looked.join(", ")
    )))
}

/// The ShareGPT file, from the same places as the models.
pub fn sharegpt() -> Result<PathBuf> {
    find(SHAREGPT.0, SHAREGPT.1)
}

/// A model name (`smollm2`, `qwen05`, `qwen15`) or a path to a GGUF file.
pub fn resolve(name: &str) -> Result<PathBuf> {
    if let Some((_, file, fetch)) = KNOWN.iter().find(|(n, _, _)| *n == name) {
        return find(file, fetch).map_err(|e| EngineError::Missing(format!("model {name}: {e}")));
    }
    let p = PathBuf::from(name);
    if !p.exists() {
        let names: Vec<_> = KNOWN.iter().map(|k| k.0).collect();
        return Err(EngineError::Missing(format!(
            "no model file {name} (known names: {})",
            names.join(", ")
        )));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_name_lists_the_known_ones() {
        let err = resolve("no-such-model-here").unwrap_err().to_string();
        assert!(err.contains("smollm2, qwen05, qwen15"), "{err}");
    }
}
