//! The model under the `tokenizers` crate's pipeline (added tokens, normalizer,
//! pre-tokenizer, decoder): byte-level or SentencePiece BPE, each over a compact vocabulary.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tokenizers::{AddedToken, Model, Token, Trainer};

use super::bpe::Bpe;
use super::pieces::Pieces;
use super::spm::Spm;

pub enum Vocab {
    Bpe(Bpe),
    Spm(Spm),
}

impl Vocab {
    fn pieces(&self) -> &Pieces {
        match self {
            Vocab::Bpe(b) => &b.pieces,
            Vocab::Spm(s) => &s.pieces,
        }
    }
}

impl Model for Vocab {
    type Trainer = NoTrainer;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        let ids = match self {
            Vocab::Bpe(b) => b.encode(sequence),
            Vocab::Spm(s) => s.encode(sequence)?,
        };
        let pieces = self.pieces();
        Ok(ids
            .into_iter()
            .map(|(id, r)| Token::new(id, pieces.piece(id).to_owned(), (r.start, r.end)))
            .collect())
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.pieces().id(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        let pieces = self.pieces();
        ((id as usize) < pieces.count()).then(|| pieces.piece(id).to_owned())
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        let pieces = self.pieces();
        (0..pieces.count() as u32)
            .map(|id| (pieces.piece(id).to_owned(), id))
            .collect()
    }

    fn get_vocab_size(&self) -> usize {
        self.pieces().count()
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
