//! The model under the `tokenizers` crate's pipeline (added tokens, normalizer, decoder): its
//! own byte-level BPE, or our compact SentencePiece one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tokenizers::models::bpe::BPE;
use tokenizers::{AddedToken, Model, Token, Trainer};

use super::spm::Spm;

pub enum Vocab {
    Bpe(BPE),
    Spm(Spm),
}

impl Model for Vocab {
    type Trainer = NoTrainer;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        match self {
            Vocab::Bpe(b) => b.tokenize(sequence),
            Vocab::Spm(s) => Ok(s
                .encode(sequence)?
                .into_iter()
                .map(|(id, range)| Token::new(id, s.piece(id).to_owned(), (range.start, range.end)))
                .collect()),
        }
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        match self {
            Vocab::Bpe(b) => b.token_to_id(token),
            Vocab::Spm(s) => s.id(token),
        }
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        match self {
            Vocab::Bpe(b) => b.id_to_token(id),
            Vocab::Spm(s) => ((id as usize) < s.vocab_size()).then(|| s.piece(id).to_owned()),
        }
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        match self {
            Vocab::Bpe(b) => b.get_vocab(),
            Vocab::Spm(s) => (0..s.vocab_size() as u32)
                .map(|id| (s.piece(id).to_owned(), id))
                .collect(),
        }
    }

    fn get_vocab_size(&self) -> usize {
        match self {
            Vocab::Bpe(b) => b.get_vocab_size(),
            Vocab::Spm(s) => s.vocab_size(),
        }
    }

    fn save(&self, _folder: &Path, _prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        Err("a tokenizer built from a GGUF is not saved: the GGUF holds it".into())
    }

    fn get_trainer(&self) -> NoTrainer {
        NoTrainer
    }
}

/// A GGUF's vocabulary is read, never trained; the crate's `Model` asks for a trainer anyway.
pub struct NoTrainer;

impl Trainer for NoTrainer {
    type Model = Vocab;

    fn should_show_progress(&self) -> bool {
        false
    }

    fn train(&self, _model: &mut Vocab) -> tokenizers::Result<Vec<AddedToken>> {
        Err("a GGUF's vocabulary is read, not trained".into())
    }

    fn feed<I, S, F>(&mut self, _iterator: I, _process: F) -> tokenizers::Result<()>
    where
        I: Iterator<Item = S> + Send,
        S: AsRef<str> + Send,
        F: Fn(&str) -> tokenizers::Result<Vec<String>> + Sync,
    {
        Err("a GGUF's vocabulary is read, not trained".into())
    }
}
