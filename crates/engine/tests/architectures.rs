//! The architectures users bring, held to llama.cpp on synthetic weights: for each family's
//! GGUF written by `scripts/ref/synth.py` (the very file llama.cpp ran: its SHA-256 is in the
//! fixture), our logits at the positions the fixture keeps (the middle and the end of three
//! prompts, run as a prefill, a second chunk, then greedy decode steps one token at a time)
//! against llama.cpp's: cosine >= 0.999 at every position, and our top token one llama.cpp
//! puts within a margin of its own top: 1e-3 relative, or three times the position's RMS
//! logit difference where that is more (the noise two correct 8-bit-activation
//! implementations put between them: 0.2-0.45 on the families whose logits are ~100,
//! 0.01-0.05 on the rest). So wherever llama.cpp's top two are further apart, the top token
//! is the same.
//! Our tokenizer on the strings fixture gives llama.cpp's ids under each family's
//! pre-tokenizer.

use std::path::PathBuf;

use edgeprompt_engine::{Model, Sequence};

mod common;

const ARCHS: [&str; 13] = [
    "qwen3",
    "llama3",
    "granite",
    "smollm3",
    "phi3",
    "gemma2",
    "qwen3moe",
    "qwen35",
    "qwen35-0.8b-shape",
    "qwen35moe",
    "lfm2",
    "gemma4",
    "gemma4-e2b-shape",
];

/// Every matrix of a small Llama in one GGUF format: f16 and bf16 kept as stored and expanded
/// a row at a time, the rest in our packed kernels.
const FORMATS: [&str; 8] = [
    "fmt_f16",
    "fmt_bf16",
    "fmt_q5_1",
    "fmt_q2_k",
    "fmt_q3_k",
    "fmt_q5_k",
    "fmt_iq4_nl",
    "fmt_iq4_xs",
];

/// Tokenizer-only files: the pre-tokenizer names the engine accepts beyond the families', a
/// file that does not say whether a prompt starts with BOS (llama.cpp's default then), and
/// Gemma 4's SentencePiece-style BPE.
const TOKENIZERS: [&str; 6] = [
    "tok_default",
    "tok_llama3",
    "tok_smaug_bpe",
    "tok_llama4",
    "tok_lfm2_bos",
    "tok_gemma4",
];

fn synth(name: &str) -> PathBuf {
    common::synth_path(name)
}

fn sha256(path: &std::path::Path) -> String {
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    ab / (aa.sqrt() * bb.sqrt())
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |x| x.0)
}

/// One architecture against its fixture; returns (worst cosine, positions compared).
/// What a family's check saw: positions, the worst cosine, the largest RMS logit difference,
/// and the positions where our top token was another within llama.cpp's margin.
struct Seen {
    positions: usize,
    worst: f64,
    rms: f64,
    ties: usize,
}

fn check(name: &str) -> Seen {
    let fixture = common::read_json(&format!("synth/{name}.json"));
    let path = synth(name);
    assert_eq!(
        sha256(&path),
        fixture["sha256"].as_str().unwrap(),
        "{name}: the GGUF is not the one llama.cpp ran (regenerate both with scripts/ref/)"
    );
    let m = Model::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    let vocab = fixture["vocab"].as_u64().unwrap() as usize;
    let records = fixture["logits"].as_array().unwrap();
    let rows = match records.is_empty() {
        true => Vec::new(),
        false => common::read_f16_rows(&format!("synth/{name}.f16"), vocab),
    };
    assert_eq!(rows.len(), records.len());
    // Each prompt in one sequence: the first kept position by a prefill, the next by a second
    // chunk, each decode step by one token.
    let (mut seq, mut fed): (Option<Sequence>, Vec<u32>) = (None, Vec::new());
    let (mut worst, mut worst_rms, mut ties) = (1.0f64, 0f64, 0);
    for (r, want) in records.iter().zip(&rows) {
        let ids: Vec<u32> = r["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        if !ids.starts_with(&fed) || seq.is_none() {
            seq = Some(Sequence::new(&m));
            fed.clear();
        }
        let s = seq.as_mut().unwrap();
        let logits = s.prefill(&m, &ids[fed.len()..]).unwrap();
        fed = ids;
        let c = cosine(&logits[..vocab], want);
        let at = format!("{name}: prompt {} position {}", r["prompt"], r["position"]);
        assert!(c >= 0.999, "{at}: cosine {c}");
        worst = worst.min(c);
        let top1 = r["top1"].as_u64().unwrap() as usize;
        let rms = (logits[..vocab]
            .iter()
            .zip(want)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum::<f64>()
            / vocab as f64)
            .sqrt();
        worst_rms = worst_rms.max(rms);
        let margin = (1e-3 * (want[top1] as f64).abs()).max(3.0 * rms);
        let ours = argmax(&logits[..vocab]);
        if ours != top1 {
            let behind = (want[top1] - want[ours]) as f64;
            assert!(
                behind <= margin,
                "{at}: our top token {ours} is {behind} below llama.cpp's {top1} (margin {margin:.3})"
            );
            ties += 1;
        }
    }
    // The tokenizer under this family's pre-tokenizer.
    for case in fixture["tokenizer"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(m.tokenizer.encode(text).unwrap(), want, "{name}: {text:?}");
    }
    // A prompt as llama.cpp starts one (tokenizer-only files): with BOS exactly when it adds one.
    if let Some(p) = fixture.get("prompt") {
        let want: Vec<u32> = p["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let text = p["text"].as_str().unwrap();
        assert_eq!(
            m.tokenizer.encode_prompt(text).unwrap(),
            want,
            "{name}: prompt"
        );
    }
    Seen {
        positions: records.len(),
        worst,
        rms: worst_rms,
        ties,
    }
}

#[test]
fn every_family_matches_llama_cpp_on_synthetic_weights() {
    let mut rows = Vec::new();
    for name in ARCHS.into_iter().chain(FORMATS).chain(TOKENIZERS) {
        if !common::root()
            .join(format!("tests/fixtures/synth/{name}.json"))
            .exists()
        {
            panic!("{name}: no fixture (scripts/ref/synth_logits.py writes it)");
        }
        let s = check(name);
        rows.push(format!(
            "{name}: {} positions, worst cosine {:.6}, largest RMS logit difference {:.3}, {} top tokens another within the margin",
            s.positions, s.worst, s.rms, s.ties
        ));
    }
    for r in rows {
        println!("{r}");
    }
}

/// The contract every family keeps (Qwen3-MoE's experts included): a sequence's logits are the
/// same bits alone or in a batch with others, and whether its prompt ran whole or in chunks.
#[test]
fn every_family_is_batch_invariant_and_chunking_exact() {
    for name in ARCHS.into_iter().chain(FORMATS) {
        let m = Model::load(synth(name)).unwrap();
        let prompts = [
            "Tickets are refundable up to a day before departure.",
            "fn main() { println!(\"hello\"); }",
            "A much longer third prompt, so that the rows of the batch differ in number and the \
             experts each row picks differ too.",
        ];
        let ids: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| m.tokenizer.encode_prompt(p).unwrap())
            .collect();
        let alone: Vec<Vec<f32>> = ids
            .iter()
            .map(|i| Sequence::new(&m).prefill(&m, i).unwrap())
            .collect();
        let mut seqs: Vec<Sequence> = ids.iter().map(|_| Sequence::new(&m)).collect();
        let mut batch: Vec<(&mut Sequence, &[u32])> = seqs
            .iter_mut()
            .zip(&ids)
            .map(|(s, i)| (s, i.as_slice()))
            .collect();
        let together = m.forward(&mut batch).unwrap();
        for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{name}: prompt {i} alone and batched differ"
            );
        }
        let mut chunked = Sequence::new(&m);
        let last = ids[2].len();
        let mut logits = Vec::new();
        for piece in ids[2].chunks(5) {
            logits = chunked.prefill(&m, piece).unwrap();
        }
        assert_eq!(chunked.len(), last);
        assert!(
            logits
                .iter()
                .zip(&alone[2])
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{name}: chunked and whole differ"
        );
    }
}
