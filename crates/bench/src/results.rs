//! Reading a results file and writing its figures: the helpers the sections of
//! `docs/results.md` share. It imports no benchmark, so every bench's section can use it.

use std::path::Path;

use serde_json::Value;

/// `dir/name` as JSON, or None where there is no such run (its section is left out).
pub(crate) fn load(dir: &Path, name: &str) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join(name)).ok()?;
    serde_json::from_str(&text).ok()
}

/// A figure as a float, NaN where it is missing.
pub(crate) fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// A number, or "-" where the run did not measure it.
pub(crate) fn num(x: f64, digits: usize) -> String {
    if x.is_nan() {
        "-".into()
    } else {
        format!("{x:.digits$}")
    }
}

/// A run's machine, model and threads: the line under a section's title.
pub(crate) fn machine_line(v: &Value) -> String {
    let threads = match &v["threads"] {
        Value::Null => String::new(),
        t => format!("; threads {t}"),
    };
    format!(
        "{}; model {}{threads}",
        machine_of(&v["machine"]),
        v["model"].as_str().unwrap_or("?"),
    )
}

/// A run's machine: CPU, cores, SIMD, kernel path and revision.
pub(crate) fn machine_of(m: &Value) -> String {
    // Results from before the field have no kernel path: the best the CPU had.
    let kernels = m["kernels"]
        .as_str()
        .map_or(String::new(), |k| format!("; kernels {k}"));
    format!(
        "{} ({} cores, {}{kernels}), rev `{}`",
        m["cpu"].as_str().unwrap_or("?"),
        m["cores"],
        m["simd"]
            .as_array()
            .map(|a| a
                .iter()
                .filter_map(|x| x.as_str())
                .collect::<Vec<_>>()
                .join("/"))
            .unwrap_or_default(),
        m["git_rev"].as_str().unwrap_or("?"),
    )
}

/// `machine_line` for the two-model reports (align, lslm).
pub(crate) fn pair_line(v: &Value) -> String {
    let mut v = v.clone();
    v["model"] = Value::String(format!(
        "{} (cloud) / {} (edge)",
        v["llm"].as_str().unwrap_or("?"),
        v["slm"].as_str().unwrap_or("?")
    ));
    machine_line(&v)
}
