//! Every command README.md, docs/ and scripts/ show still exists as written: each
//! `edgeprompt <sub>` and `edgeprompt-bench <sub>` names a real subcommand and each of its
//! `--flags` is one that subcommand takes (read from the binaries' own `--help`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The product binary beside this crate's (a workspace test run builds it fresh: its crate has
/// tests too), built here only if a single-crate run has not.
fn product() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_edgeprompt-bench")).with_file_name("edgeprompt");
    if !p.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let profile = if cfg!(debug_assertions) {
            "dev"
        } else {
            "release"
        };
        let ok = Command::new(cargo)
            .current_dir(root())
            .args(["build", "--profile", profile, "--bin", "edgeprompt"])
            .status()
            .expect("cargo build runs")
            .success();
        assert!(ok, "building the product binary failed");
    }
    p
}

/// Documented lines, backslash continuations joined, with where they came from.
fn documented_lines() -> Vec<(String, String)> {
    let r = root();
    let mut files = vec![r.join("README.md")];
    for dir in ["docs", "scripts"] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(r.join(dir))
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "md" || x == "sh"))
            .collect();
        found.sort();
        files.extend(found);
    }
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let mut line = String::new();
        for (n, l) in text.lines().enumerate() {
            line.push_str(l.trim_end_matches('\\'));
            if l.ends_with('\\') {
                line.push(' ');
                continue;
            }
            out.push((
                format!("{}:{}", f.display(), n + 1),
                std::mem::take(&mut line),
            ));
        }
    }
    out
}

/// Subcommand name -> its `--help` text.
fn help(bin: &Path) -> HashMap<String, String> {
    let top = Command::new(bin).arg("--help").output().unwrap();
    let top = String::from_utf8_lossy(&top.stdout).to_string();
    let subs: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|s| s != "help")
        .collect();
    assert!(!subs.is_empty(), "no subcommands in:\n{top}");
    subs.into_iter()
        .map(|s| {
            let o = Command::new(bin).args([&s, "--help"]).output().unwrap();
            assert!(o.status.success(), "{} {s} --help failed", bin.display());
            (s, String::from_utf8_lossy(&o.stdout).to_string())
        })
        .collect()
}

#[test]
fn every_documented_command_and_flag_exists() {
    let bins = [
        (
            "edgeprompt-bench",
            help(Path::new(env!("CARGO_BIN_EXE_edgeprompt-bench"))),
        ),
        ("edgeprompt", help(&product())),
    ];
    let mut checked = 0;
    for (at, line) in documented_lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            let w = w.trim_start_matches('`');
            let name = w.rsplit('/').next().unwrap_or(w);
            let Some((bin, subs)) = bins.iter().find(|(b, _)| *b == name) else {
                continue;
            };
            let Some(sub) = words.get(i + 1).map(|s| s.trim_end_matches('`')) else {
                continue;
            };
            assert!(
                !(*bin == "edgeprompt" && sub == "bench"),
                "{at}: the benchmarks are `edgeprompt-bench`, not `edgeprompt bench`"
            );
            let Some(text) = subs.get(sub) else {
                // Prose ("the edgeprompt binary"), not a command.
                continue;
            };
            checked += 1;
            for flag in words[i + 2..]
                .iter()
                .take_while(|t| !matches!(**t, "&" | "|" | "#" | ";" | "&&"))
                .map(|t| t.trim_matches(|c| c == '`' || c == '[' || c == ']'))
                .filter(|t| t.starts_with("--"))
            {
                let flag = flag.split('=').next().unwrap_or(flag);
                assert!(
                    text.contains(&format!("{flag} ")) || text.contains(&format!("{flag}\n")),
                    "{at}: `{bin} {sub}` has no {flag}"
                );
            }
        }
    }
    assert!(checked >= 20, "only {checked} documented commands found");
}
