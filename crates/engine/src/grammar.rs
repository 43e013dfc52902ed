//! Constrained decoding: a grammar (a JSON schema, Lark, a regex) compiled by llguidance over
//! the model's vocabulary. Its mask is put on one row's logits before that row's draw, and
//! nothing else changes: a constrained answer is as batch-invariant as any other.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::{Sampler, Tokenizer};

#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// The grammar itself is wrong or too large (a client error).
    #[error("grammar: {0}")]
    Invalid(String),
    /// The grammar ran into a state it cannot leave, or ran out of its work budget.
    #[error("constrained decoding: {0}")]
    Failed(String),
}

/// What an answer must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// A JSON value valid under this schema (`{"type": "object"}`: any object).
    JsonSchema(Value),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
    /// A regular expression the whole answer matches.
    Regex(String),
}

/// The compiler of grammars for one model: its vocabulary as llguidance's token trie, built
/// once (0.13 s for SmolLM2's 49k tokens, 0.49 s for Qwen2.5's 152k on a Zen 4 core).
pub struct Grammars {
    factory: ParserFactory,
    /// Logits a row has (may exceed the tokenizer's vocabulary: padded embeddings).
    width: usize,
}

impl Grammars {
    /// For `model`'s vocabulary; its end-of-turn tokens end an answer.
    pub fn for_model(model: &crate::Model) -> Result<Self, GrammarError> {
        Self::new(
            &model.tokenizer,
            model.cfg.vocab_size,
            &model.tokenizer.stop_ids,
        )
    }

    /// `width`: the model's logits per row. `ends`: the ids that end an answer.
    pub fn new(tokenizer: &Tokenizer, width: usize, ends: &[u32]) -> Result<Self, GrammarError> {
        let mut words = tokenizer.token_bytes();
        if words.len() > width {
            return Err(GrammarError::Invalid(format!(
                "the tokenizer has {} tokens, the model {width} logits",
                words.len()
            )));
        }
        // Padding ids no text spells.
        while words.len() < width {
            words.push(format!("\u{FF}<[{}]>", words.len()).into_bytes());
        }
        let eos = *ends
            .first()
            .ok_or_else(|| GrammarError::Invalid("the model has no end-of-answer token".into()))?;
        let info = TokRxInfo::new(width as u32, eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(ends);
        let env: TokEnv = Arc::new(Vocabulary { trie });
        let mut factory = ParserFactory::new(
            &env,
            InferenceCapabilities::default(),
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| GrammarError::Invalid(e.to_string()))?;
        factory.quiet();
        Ok(Self { factory, width })
    }

    /// Compile `spec`; its errors are the client's.
    pub fn constraint(&self, spec: &Spec) -> Result<Constraint, GrammarError> {
        let grammar = match spec {
            Spec::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(bounded_whitespace(schema.clone()))
            }
            Spec::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
            Spec::Regex(rx) => TopLevelGrammar::from_regex(rx),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| GrammarError::Invalid(first_line(e)))?;
        let mut matcher = Matcher::new(Ok(parser));
        // A grammar that admits no answer at all (a `$ref` cycle that never reaches a value)
        // is the client's error, found here rather than at the first token.
        let admits = matcher.compute_mask_or_eos().is_ok_and(|m| m.num_set() > 0);
        if !admits {
            return Err(GrammarError::Invalid(
                "it admits no answer at all (a $ref that never reaches a value?)".into(),
            ));
        }
        Ok(Constraint {
            matcher,
            width: self.width,
            masked: Vec::new(),
        })
    }
}

/// Whitespace JSON may have between its tokens: a space, or a line break and an indent. It
/// is bounded so a small model cannot spend its answer on blank space (llguidance's default
/// takes any run of it).
const JSON_WHITESPACE: &str = r"(\x20|\x0D?\x0A[\x20\x09]{0,40})";

/// `schema` with the bounded whitespace, unless it sets llguidance's options itself.
pub fn bounded_whitespace(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_pattern": JSON_WHITESPACE}));
    }
    schema
}

/// The vocabulary as llguidance reads it. Text is tokenized greedily over the trie (llguidance
/// only does so for forced tokens, which are not used here).
struct Vocabulary {
    trie: TokTrie,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// The grammar library's message without the parser state it appends (internals, and they
/// may quote the answer).
fn first_line(e: impl std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

fn failed(e: impl std::fmt::Display) -> GrammarError {
    GrammarError::Failed(first_line(e))
}

/// One answer's grammar state.
pub struct Constraint {
    matcher: Matcher,
    width: usize,
    /// The row's logits with the mask on, reused between tokens.
    masked: Vec<f32>,
}

impl Constraint {
    /// Draw the next token from `logits` with every token the grammar forbids at -inf, and
    /// advance the grammar by it. Once the grammar is complete only the end tokens remain.
    pub fn draw(&mut self, sampler: &mut Sampler, logits: &[f32]) -> Result<u32, GrammarError> {
        let mask = self.matcher.compute_mask_or_eos().map_err(failed)?;
        if logits.len() != self.width {
            return Err(GrammarError::Failed(format!(
                "{} logits for a grammar over {}",
                logits.len(),
                self.width
            )));
        }
        self.masked.clear();
        self.masked.resize(logits.len(), f32::NEG_INFINITY);
        let mut any = false;
        mask.iter_set_entries(|i| {
            if let (Some(m), Some(&l)) = (self.masked.get_mut(i), logits.get(i)) {
                *m = l;
                any = true;
            }
        });
        if !any {
            return Err(GrammarError::Failed(
                "the grammar allows no token here".into(),
            ));
        }
        let id = sampler.sample(&self.masked);
        if !mask.is_allowed(id) {
            // Every allowed logit was NaN or -inf: the draw fell outside the mask.
            return Err(GrammarError::Failed(
                "no allowed token has a finite logit".into(),
            ));
        }
        // A finished grammar allows only the end tokens, which it does not take in.
        if !self.matcher.is_stopped() {
            self.matcher.consume_token(id).map_err(failed)?;
        }
        Ok(id)
    }

    /// A copy in the same state, for a further answer to the same prompt.
    pub fn fork(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            width: self.width,
            masked: Vec::new(),
        }
    }

    /// Whether the grammar has matched a whole answer (an end token is then allowed).
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false) || self.matcher.is_stopped()
    }
}
