//! Held-out cases from conversations in ShareGPT's format (a JSON array of records with
//! `conversations: [{from, value}]`): the earlier turns are the cloud prompt (a system
//! message), the next user turn is private, and the assistant's real answer is what gets
//! scored (teacher forcing). The quality bench, the fuser's training data and its evaluation
//! all cut conversations here, the same way.

use std::path::Path;
use std::sync::Arc;

use edgeprompt_engine::sequence::PrefillPass;
use edgeprompt_engine::{LayerKv, Message, Model, PrefixKv};

use crate::job::{cut, system_ids};
use crate::sharegpt::Turn;
use crate::{AlignError, Result};

/// Token limits of one case.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub cloud_tokens: usize,
    pub user_tokens: usize,
    pub answer_tokens: usize,
}

/// One case: token ids under both models (they share a tokenizer).
#[derive(Debug, Clone)]
pub struct Case {
    /// The ShareGPT record it came from.
    pub record: usize,
    /// The cloud prompt's text (the system message).
    pub system: String,
    /// The cloud prompt: the earlier turns as a system message, rendered.
    pub cloud: Vec<u32>,
    /// The private user turn, rendered up to where the answer starts.
    pub private: Vec<u32>,
    pub answer: Vec<u32>,
}

/// The earlier turns as one text, speaker by speaker.
pub fn transcript(turns: &[Turn]) -> String {
    turns
        .iter()
        .map(|t| {
            let who = if t.from == "human" {
                "User"
            } else {
                "Assistant"
            };
            format!("{who}: {}\n", t.text)
        })
        .collect()
}

/// Up to `n` cases from records `first_record..` of `path` (fewer if the file runs out). A
/// record gives a case at its first user turn that has at least two turns before it and an
/// answer after it, if the answer has 16 tokens or more and the cloud prompt at least half of
/// `cloud_tokens`.
pub fn cases(
    llm: &Model,
    slm: &Model,
    path: &Path,
    first_record: usize,
    n: usize,
    lim: Limits,
) -> Result<Vec<Case>> {
    let chat = llm
        .chat
        .as_ref()
        .ok_or_else(|| AlignError::Calibration("model has no chat template".into()))?;
    let convs = crate::sharegpt::conversations(path, first_record + 40 * n)?;
    let mut out = Vec::new();
    for (record, conv) in convs.iter().enumerate().skip(first_record) {
        let Some(k) = (2..conv.len().saturating_sub(1))
            .find(|&k| conv[k].from == "human" && conv[k + 1].from == "gpt")
        else {
            continue;
        };
        let context = transcript(&conv[..k]);
        // Shorter texts are kept whole.
        let system = cut(llm, &context, lim.cloud_tokens).unwrap_or(context);
        let user =
            cut(llm, &conv[k].text, lim.user_tokens).unwrap_or_else(|_| conv[k].text.clone());
        let answer = llm.tokenizer.encode(&conv[k + 1].text)?;
        let cloud_len = llm.tokenizer.encode(&system)?.len();
        if answer.len() < 16 || cloud_len < lim.cloud_tokens / 2 || user.trim().is_empty() {
            continue;
        }
        let split = chat.split(&system, &[Message::new("user", &user)])?;
        let cloud = system_ids(llm, slm, &system)?;
        let private = llm.tokenizer.encode(&split.edge)?;
        out.push(Case {
            record,
            system,
            cloud,
            private,
            answer: answer[..answer.len().min(lim.answer_tokens)].to_vec(),
        });
        if out.len() == n {
            break;
        }
    }
    Ok(out)
}

/// Every layer of `model` over `ids` from position 0: the prompt's KV.
pub fn prefix_of(model: &Model, ids: &[u32]) -> Result<PrefixKv> {
    let mut pass = PrefillPass::new(model, ids, 0)?;
    for _ in 0..model.cfg.n_layer {
        pass.run_layer(model, None)?;
    }
    Ok(pass.into_prefix(model)?)
}

/// The logits that predict each of `answer`'s tokens, after the cloud prompt's `layers` (one
/// per model layer) and the private turn: `[answer.len(), vocab]`, row-major.
pub fn answer_logits(
    model: &Model,
    layers: &[Arc<LayerKv>],
    cloud_len: usize,
    private: &[u32],
    answer: &[u32],
) -> Result<Vec<f32>> {
    if private.is_empty() || answer.is_empty() {
        return Err(AlignError::Calibration(
            "a case needs a private turn and an answer".into(),
        ));
    }
    let full: Vec<u32> = private.iter().chain(answer).copied().collect();
    let mut pass = PrefillPass::new(model, &full, cloud_len)?;
    for layer in layers {
        pass.run_layer(model, Some(layer))?;
    }
    let d = model.cfg.n_embd;
    let (p, n) = (private.len(), full.len());
    Ok(model.logits(&pass.hidden()[(p - 1) * d..(n - 1) * d])?)
}

/// Per logits row: the negative log-likelihood of `target` and the log-sum-exp.
pub fn nll(row: &[f32], target: u32) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max as f64
        + row
            .iter()
            .map(|&x| ((x - max) as f64).exp())
            .sum::<f64>()
            .ln();
    lse - row[target as usize] as f64
}
