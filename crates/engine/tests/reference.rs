//! The engine against independent implementations of the same GGUF (fixtures made by
//! `scripts/ref/`): token ids from the `transformers` tokenizer built from the GGUF, and
//! last-position logits from a plain numpy forward pass over `gguf`-dequantized weights.

mod common;

use edgeprompt_engine::Model;

fn tokenizer_matches(model: &Model, fixture: &str) {
    let fx = common::read_json(fixture);
    let cases = fx["cases"].as_array().expect("cases");
    assert!(
        cases.len() >= 50,
        "need at least 50 strings, fixture has {}",
        cases.len()
    );
    let mut bad = Vec::new();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let want: Vec<u32> = c["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = model.tokenizer.encode(text).unwrap();
        if got != want {
            bad.push(format!(
                "{text:?}\n  ours:      {got:?}\n  reference: {want:?}"
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} strings differ:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
    for d in fx["decode_checks"].as_array().into_iter().flatten() {
        let ids: Vec<u32> = d["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(
            model.tokenizer.decode(&ids).unwrap(),
            d["text"].as_str().unwrap()
        );
    }
    if let Some(eos) = fx["eos_id"].as_u64() {
        assert_eq!(model.tokenizer.eos_id, Some(eos as u32));
    }
}

#[test]
fn tokenizer_matches_transformers_smollm2() {
    tokenizer_matches(&common::smollm2(), "tokenizer_smollm2.json");
}

#[test]
fn tokenizer_matches_transformers_qwen05() {
    tokenizer_matches(&common::qwen05(), "tokenizer_qwen05.json");
}

fn read_f16(name: &str) -> Vec<f32> {
    let bytes = std::fs::read(common::fixture(name)).expect("logits fixture");
    bytes
        .chunks_exact(2)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

fn logits_match(model: &Model, stem: &str) {
    let fx = common::read_json(&format!("{stem}.json"));
    let all = read_f16(&format!("{stem}.f16"));
    let vocab = model.cfg.vocab_size;
    let prompts = fx["prompts"].as_array().expect("prompts");
    assert!(prompts.len() >= 10, "need at least 10 prompts");
    let mut worst_cos = 1.0f64;
    for p in prompts {
        let ids: Vec<u32> = p["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let off = p["offset"].as_u64().unwrap() as usize;
        let want = &all[off * vocab..(off + 1) * vocab];
        let mut seq = edgeprompt_engine::Sequence::new(model);
        let got = seq.prefill(model, &ids).unwrap();
        let dot: f64 = got
            .iter()
            .zip(want)
            .map(|(a, b)| *a as f64 * *b as f64)
            .sum();
        let norm = |v: &[f32]| v.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
        let cos = dot / (norm(&got) * norm(want));
        let top1 = edgeprompt_engine::sample::argmax(&got);
        let want_top1 = p["top1"].as_u64().unwrap() as u32;
        eprintln!(
            "{:<24} {:4} tokens: cosine {cos:.5}, top-1 ours {top1} reference {want_top1}",
            p["name"].as_str().unwrap_or("?"),
            ids.len()
        );
        assert_eq!(top1, want_top1, "{}: top-1 differs", p["name"]);
        assert!(cos >= 0.99, "{}: cosine {cos}", p["name"]);
        worst_cos = worst_cos.min(cos);
    }
    eprintln!("{stem}: worst cosine {worst_cos:.5}");
}

#[test]
fn logits_match_numpy_reference_smollm2() {
    logits_match(&common::smollm2(), "logits_smollm2");
}

#[test]
fn logits_match_numpy_reference_qwen05() {
    logits_match(&common::qwen05(), "logits_qwen05");
}
