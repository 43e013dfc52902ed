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

/// Gemma 3's SentencePiece tokenizer against llama.cpp's (fixture by
/// `scripts/ref/tokenizer_llamacpp.py`).
#[test]
fn tokenizer_matches_llamacpp_gemma3() {
    let m = common::gemma3();
    tokenizer_matches(&m, "tokenizer_gemma3.json");
    assert!(m.tokenizer.add_bos);
    assert_eq!(m.tokenizer.encode_prompt("Hi").unwrap()[0], 2);
}

fn read_f16(name: &str) -> Vec<f32> {
    let bytes = std::fs::read(common::fixture(name)).expect("logits fixture");
    bytes
        .chunks_exact(2)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

/// Reference top-2 margin (logits) under which 8-bit activation rounding may swap them.
const NEAR_TIE: f64 = 0.15;

fn logits_match(model: &Model, stem: &str, min_cos: f64) {
    let fx = common::read_json(&format!("{stem}.json"));
    let all = read_f16(&format!("{stem}.f16"));
    let vocab = model.cfg.vocab_size;
    let prompts = fx["prompts"].as_array().expect("prompts");
    assert!(prompts.len() >= 10, "need at least 10 prompts");
    let (mut worst_cos, mut strict, mut near_ties) = (1.0f64, 0, 0);
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
        assert!(cos >= min_cos, "{}: cosine {cos}", p["name"]);
        // The engine quantizes activations to 8 bits per block (as llama.cpp does); the
        // reference keeps f32. When the reference's top two are within NEAR_TIE logits, either
        // answer is within that noise: we require ours to be the reference's second choice and
        // count it separately. Everything else must match exactly.
        let t5: Vec<u64> = p["top5"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let l5: Vec<f64> = p["top5_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        if top1 == want_top1 {
            strict += 1;
        } else {
            assert!(
                l5[0] - l5[1] < NEAR_TIE && top1 as u64 == t5[1],
                "{}: top-1 {top1} differs from the reference's {want_top1} (margin {:.3})",
                p["name"],
                l5[0] - l5[1]
            );
            near_ties += 1;
        }
        worst_cos = worst_cos.min(cos);
    }
    eprintln!(
        "{stem}: worst cosine {worst_cos:.5}; top-1 identical on {strict}/{} prompts, {near_ties} near-tie(s) resolved to the reference's second choice",
        prompts.len()
    );
    assert!(strict >= 10, "top-1 must match on at least 10 prompts");
}

#[test]
fn logits_match_numpy_reference_smollm2() {
    logits_match(&common::smollm2(), "logits_smollm2", 0.99);
}

#[test]
fn logits_match_numpy_reference_qwen05() {
    logits_match(&common::qwen05(), "logits_qwen05", 0.99);
}

/// Gemma 3 (sliding window, QK norms, GELU), two prompts longer than its 512-token window.
/// Its residual stream reaches 1e5, so 8-bit activations cost more than on the other models:
/// llama.cpp itself scores 0.9977..0.9999 against this reference (fixture's
/// `llama_cpp_cosine`), the reference with 8-bit activations emulated 0.998; ours 0.995..0.9999.
#[test]
fn logits_match_numpy_reference_gemma3() {
    logits_match(&common::gemma3(), "logits_gemma3", 0.995);
}
