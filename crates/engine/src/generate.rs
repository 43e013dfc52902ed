//! The generation loop: prefill, then sample and decode until EOS, a stop string or the
//! token budget, streaming text as it becomes final.

use std::time::Instant;

use crate::model::Model;
use crate::sample::{Sampler, SamplingParams};
use crate::sequence::Sequence;
use crate::tokenizer::Tokenizer;
use crate::Result;

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Prefill chunk size (tokens per forward call).
    pub prefill_chunk: usize,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_tokens: 128,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            prefill_chunk: 512,
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    pub prefill_secs: f64,
    pub ttft_secs: f64,
    pub completion_tokens: usize,
    pub decode_secs: f64,
    pub finish_reason: String,
    pub text: String,
    pub token_ids: Vec<u32>,
}

impl GenerateStats {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_secs.max(1e-9)
    }
    pub fn decode_tok_s(&self) -> f64 {
        // The first token comes from prefill; the rest from decode steps.
        self.completion_tokens.saturating_sub(1) as f64 / self.decode_secs.max(1e-9)
    }
}

pub struct Generator<'m> {
    model: &'m Model,
}

impl<'m> Generator<'m> {
    pub fn new(model: &'m Model) -> Self {
        Self { model }
    }

    /// Prefill `prompt` into `seq` and generate. `on_text` receives text as it becomes final.
    pub fn run(
        &self,
        seq: &mut Sequence,
        prompt: &[u32],
        opts: &GenerateOptions,
        mut on_text: impl FnMut(&str),
    ) -> Result<GenerateStats> {
        let start = Instant::now();
        let mut logits = seq.prefill_chunked(self.model, prompt, opts.prefill_chunk)?;
        let prefill_secs = start.elapsed().as_secs_f64();
        let mut sampler = Sampler::new(opts.sampling.clone());
        let mut out = TextStream::new(&opts.stop);
        let mut ttft = 0.0;
        let mut finish = "length";
        let decode_start = Instant::now();
        while out.ids().len() < opts.max_tokens {
            let id = sampler.sample(&logits);
            if out.ids().is_empty() {
                ttft = start.elapsed().as_secs_f64();
            }
            let (delta, stopped) = out.push(&self.model.tokenizer, id)?;
            if !delta.is_empty() {
                on_text(&delta);
            }
            if stopped {
                finish = "stop";
                break;
            }
            if out.ids().len() == opts.max_tokens {
                break;
            }
            logits = seq.prefill(self.model, &[id])?;
        }
        let rest = out.finish();
        if !rest.is_empty() {
            on_text(&rest);
        }
        Ok(GenerateStats {
            prompt_tokens: prompt.len(),
            prefill_secs,
            ttft_secs: ttft,
            completion_tokens: out.ids().len(),
            decode_secs: decode_start.elapsed().as_secs_f64(),
            finish_reason: finish.into(),
            text: out.text().to_string(),
            token_ids: out.ids().to_vec(),
        })
    }
}

/// Sampled ids to text deltas. Holds back a tail that could still grow into a stop string or
/// is an incomplete UTF-8 character; ends at an end-of-turn id or a stop string (which is cut).
pub struct TextStream {
    stops: Vec<String>,
    ids: Vec<u32>,
    text: String,
    emitted: usize,
}

impl TextStream {
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ids: Vec::new(),
            text: String::new(),
            emitted: 0,
        }
    }

    /// Ids of the answer so far (without a final end-of-turn id).
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The answer so far, stop string cut.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Take one sampled id: the text that became final, and whether the answer ended.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<(String, bool)> {
        if tokenizer.stop_ids.contains(&id) {
            return Ok((String::new(), true));
        }
        self.ids.push(id);
        self.text = tokenizer.decode(&self.ids)?;
        if let Some(cut) = find_stop(&self.text, &self.stops) {
            self.text.truncate(cut);
            return Ok((self.finish(), true));
        }
        let safe = self.text.len() - held_back(&self.text, &self.stops);
        if safe > self.emitted && !self.text[..safe].ends_with('\u{FFFD}') {
            let delta = self.text[self.emitted..safe].to_string();
            self.emitted = safe;
            return Ok((delta, false));
        }
        Ok((String::new(), false))
    }

    /// Whatever is still held back, once the answer is over.
    pub fn finish(&mut self) -> String {
        let rest = self
            .text
            .get(self.emitted..)
            .unwrap_or_default()
            .to_string();
        self.emitted = self.text.len();
        rest
    }
}

fn find_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
}

/// Length of the longest tail of `text` that could still grow into a stop string.
fn held_back(text: &str, stops: &[String]) -> usize {
    let mut hold = 0;
    for s in stops {
        for (i, _) in s.char_indices().skip(1) {
            if text.ends_with(&s[..i]) {
                hold = hold.max(i);
            }
        }
    }
    hold
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_are_found_and_partial_ones_held() {
        let stops = vec!["\n\n".to_string(), "END".to_string()];
        assert_eq!(find_stop("abc\n\ndef", &stops), Some(3));
        assert_eq!(find_stop("abcEN", &stops), None);
        assert_eq!(held_back("abcEN", &stops), 2);
        assert_eq!(held_back("abc\n", &stops), 1);
        assert_eq!(held_back("abc", &stops), 0);
    }
}
