//! Tokenizers built from the GGUF's own metadata, in the `tokenizers` crate's pipeline (special
//! tokens, normalizer, pre-tokenizer, decoder) around our compact BPE models: byte-level
//! (vocabulary, merges, the pre-tokenizer named by `tokenizer.ggml.pre`), SentencePiece
//! (vocabulary and scores, byte fallback: Gemma), or SentencePiece-style BPE (Gemma 4: merges
//! over raw UTF-8 with spaces as U+2581).

mod bpe;
mod merge;
mod pieces;
mod spm;
mod vocab;

use crate::gguf::{Content, Value};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, SplitDelimiterBehavior,
    TokenizerImpl,
};

use self::bpe::Bpe;
use self::pieces::Pieces;
use self::spm::Spm;
use self::vocab::Vocab;

use crate::gguf::meta_str;
use crate::{EngineError, Result};

/// GPT-2's split pattern, also used after the digit split by SmolLM.
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Qwen2's split pattern (single digits, case-insensitive contractions).
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's: Qwen2's with combining marks kept in letter runs.
const QWEN35_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's split pattern (digits in groups of up to three).
/// GPT-4o's (Phi-4-mini, Llama 4): case runs split, digits in threes, `/` kept with the line end.
const GPT4O_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;
/// SentencePiece's word marker, standing for a space.
const SPM_SPACE: &str = "\u{2581}";

type Inner = TokenizerImpl<
    Vocab,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

pub struct Tokenizer {
    inner: Inner,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// Tokens that end generation: EOS, EOT and the chat end-of-turn markers.
    pub stop_ids: Vec<u32>,
    pub pre: String,
    /// Whether a prompt starts with BOS (`tokenizer.ggml.add_bos_token`, else llama.cpp's
    /// default for the tokenizer).
    pub add_bos: bool,
    /// GGUF token types, by id.
    types: Vec<i32>,
    /// Byte-level BPE (pieces spell bytes as GPT-2's printable characters) or SentencePiece.
    byte_level: bool,
}

impl Tokenizer {
    pub fn from_gguf(content: &Content) -> Result<Self> {
        let model = meta_str(content, "tokenizer.ggml.model")?;
        let pre = meta_str(content, "tokenizer.ggml.pre").unwrap_or_else(|_| "default".into());
        let tokens = string_array(content, "tokenizer.ggml.tokens")?;
        let types: Vec<i32> = match content.metadata.get("tokenizer.ggml.token_type") {
            Some(Value::Array(v)) => v.iter().map(|t| t.to_i32().unwrap_or(1)).collect(),
            _ => vec![1; tokens.len()],
        };
        let byte_level = model == "gpt2";
        let mut inner = match model.as_str() {
            "gpt2" => byte_level_bpe(content, &tokens, &pre)?,
            "llama" => sentencepiece_bpe(content, &tokens)?,
            "gemma4" => spaced_bpe(content, &tokens)?,
            other => {
                return Err(EngineError::Unsupported(format!(
                    "tokenizer model {other:?} (supported: byte-level BPE \"gpt2\", \
                     SentencePiece \"llama\", SentencePiece-style BPE \"gemma4\")"
                )))
            }
        };

        let mut special = Vec::new();
        let mut user = Vec::new();
        for (tok, ty) in tokens.iter().zip(&types) {
            match *ty {
                TOKEN_TYPE_CONTROL => special.push(AddedToken::from(tok.clone(), true)),
                TOKEN_TYPE_USER_DEFINED => {
                    user.push(AddedToken::from(tok.clone(), false).normalized(false))
                }
                _ => {}
            }
        }
        inner
            .add_special_tokens(special)
            .map_err(|e| EngineError::Tokenizer(format!("special tokens: {e}")))?;
        inner
            .add_tokens(user)
            .map_err(|e| EngineError::Tokenizer(format!("added tokens: {e}")))?;

        let id = |key: &str| -> Option<u32> {
            content
                .metadata
                .get(key)
                .and_then(|v| v.to_u32())
                .filter(|&i| (i as usize) < tokens.len())
        };
        let bos_id = id("tokenizer.ggml.bos_token_id");
        let eos_id = id("tokenizer.ggml.eos_token_id");
        let mut stop_ids: Vec<u32> = [eos_id, id("tokenizer.ggml.eot_token_id")]
            .into_iter()
            .flatten()
            .collect();
        for marker in [
            "<|im_end|>",
            "<|endoftext|>",
            "<|eot_id|>",
            "<|end_of_text|>",
            "<end_of_turn>",
            "<turn|>",
        ] {
            if let Some(i) = tokens.iter().position(|t| t == marker) {
                if types.get(i) == Some(&TOKEN_TYPE_CONTROL) && !stop_ids.contains(&(i as u32)) {
                    stop_ids.push(i as u32);
                }
            }
        }
        // The file's word, else llama.cpp's default: SentencePiece and the Llama 3 family of
        // pre-tokenizers start with BOS. Gemma 4 always does (llama.cpp overrides its files).
        let add_bos = match content.metadata.get("tokenizer.ggml.add_bos_token") {
            _ if model == "gemma4" => true,
            Some(Value::Bool(b)) => *b,
            _ => model == "llama" || matches!(pre.as_str(), "llama3" | "llama-bpe" | "lfm2"),
        };
        Ok(Self {
            inner,
            bos_id,
            eos_id,
            stop_ids,
            pre,
            add_bos,
            types,
            byte_level,
        })
    }

    /// Each token's bytes, as a grammar engine matches them: control tokens (`<|im_end|>`)
    /// are `0xFF` and their name, so no text spells them; every other token is the bytes it
    /// decodes to alone (`<0x0A>` is one byte, `Ġ` a space).
    pub fn token_bytes(&self) -> Vec<Vec<u8>> {
        let byte_of = gpt2_bytes();
        (0..self.vocab_size() as u32)
            .map(|id| {
                let piece = self.inner.id_to_token(id).unwrap_or_default();
                match self.types.get(id as usize).copied() {
                    Some(TOKEN_TYPE_CONTROL) => [&[0xFF], piece.as_bytes()].concat(),
                    Some(TOKEN_TYPE_USER_DEFINED) => piece.into_bytes(),
                    _ if self.byte_level => piece
                        .chars()
                        .map(|c| byte_of.get(&c).copied())
                        .collect::<Option<Vec<u8>>>()
                        .unwrap_or_else(|| piece.into_bytes()),
                    _ => match spm_byte(&piece) {
                        Some(b) => vec![b],
                        None => piece.replace(SPM_SPACE, " ").into_bytes(),
                    },
                }
            })
            .collect()
    }

    /// Token ids of a whole prompt: BOS first when the model wants one and the text does not
    /// already start with it (a chat template writes its own).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode(text)?;
        if let Some(bos) = self.bos_id.filter(|_| self.add_bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// Token ids of `text`, special tokens recognised, no BOS added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// The file's merges, each as its two sides.
fn merges(content: &Content) -> Result<Vec<(&str, &str)>> {
    let key = "tokenizer.ggml.merges";
    let Some(Value::Array(merges)) = content.metadata.get(key) else {
        return Err(EngineError::Gguf(format!("missing array {key}")));
    };
    merges
        .iter()
        .map(|m| {
            let m = m
                .to_str()
                .ok_or_else(|| EngineError::Gguf(format!("{key}: not a string")))?;
            // At the first space after the first byte, as llama.cpp: a side may be a space.
            let at = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1);
            at.map(|at| (&m[..at], &m[at + 1..]))
                .ok_or_else(|| EngineError::Tokenizer(format!("bad merge {m:?}")))
        })
        .collect::<Result<Vec<_>>>()
}

fn byte_level_bpe(content: &Content, tokens: &[String], pre: &str) -> Result<Inner> {
    let pieces = Pieces::new(tokens.iter().map(String::as_str)).map_err(EngineError::Tokenizer)?;
    let bpe = Bpe::new(pieces, merges(content)?).map_err(EngineError::Tokenizer)?;
    let mut inner = Inner::new(Vocab::Bpe(bpe));
    inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(inner)
}

/// Gemma 4's BPE as llama.cpp runs it: spaces become U+2581, the text is cut only into runs
/// of newlines and runs of anything else, merges apply to raw UTF-8 characters (no byte-level
/// alphabet), a newline run that is a token is that token whole, and a character outside the
/// vocabulary is its bytes' `<0xNN>` tokens.
fn spaced_bpe(content: &Content, tokens: &[String]) -> Result<Inner> {
    let pieces = Pieces::new(tokens.iter().map(String::as_str)).map_err(EngineError::Tokenizer)?;
    let bpe = Bpe::new(pieces, merges(content)?)
        .map_err(EngineError::Tokenizer)?
        .spaced();
    let mut inner = Inner::new(Vocab::Bpe(bpe));
    let text = |e: tokenizers::Error| EngineError::Tokenizer(e.to_string());
    let space = |a: &str, b: &str| Replace::new(a, b).map_err(text);
    inner
        .with_normalizer(Some(space(" ", SPM_SPACE)?))
        .map_err(text)?;
    let lines = Split::new(
        SplitPattern::Regex(r"[^\n]+|\n+".into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(text)?;
    inner.with_pre_tokenizer(Some(PreTokenizerWrapper::from(lines)));
    inner.with_decoder(Some(DecoderSequence::new(vec![
        space(SPM_SPACE, " ")?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ])));
    Ok(inner)
}

/// SentencePiece BPE as llama.cpp runs it: spaces become U+2581, no pre-split, adjacent pieces
/// merge highest score first, characters outside the vocabulary fall back to `<0xNN>` bytes.
fn sentencepiece_bpe(content: &Content, tokens: &[String]) -> Result<Inner> {
    let scores: Vec<f32> = match content.metadata.get("tokenizer.ggml.scores") {
        Some(Value::Array(v)) => v.iter().map(|s| s.to_f32().unwrap_or(0.0)).collect(),
        _ => return Err(EngineError::Gguf("missing tokenizer.ggml.scores".into())),
    };
    if matches!(
        content.metadata.get("tokenizer.ggml.add_space_prefix"),
        Some(Value::Bool(true))
    ) {
        return Err(EngineError::Unsupported(
            "SentencePiece with add_space_prefix".into(),
        ));
    }
    let unk = content_u32(content, "tokenizer.ggml.unknown_token_id");
    let pieces = Pieces::new(tokens.iter().map(String::as_str)).map_err(EngineError::Tokenizer)?;
    let spm = Spm::new(pieces, &scores, unk);
    let mut inner = Inner::new(Vocab::Spm(spm));
    let space =
        |a: &str, b: &str| Replace::new(a, b).map_err(|e| EngineError::Tokenizer(e.to_string()));
    inner
        .with_normalizer(Some(space(" ", SPM_SPACE)?))
        .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
    inner.with_decoder(Some(DecoderSequence::new(vec![
        space(SPM_SPACE, " ")?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ])));
    Ok(inner)
}

/// GPT-2's byte-level alphabet, read backwards: the printable character that stands for each
/// byte (printable Latin-1 bytes stand for themselves, the rest for U+0100 on).
fn gpt2_bytes() -> std::collections::HashMap<char, u8> {
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            let c = b as char;
            let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
            if printable {
                (c, b)
            } else {
                next += 1;
                (char::from_u32(next - 1).unwrap_or(c), b)
            }
        })
        .collect()
}

/// The byte of a SentencePiece byte-fallback piece (`<0x0A>`).
fn spm_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

fn content_u32(content: &Content, key: &str) -> Option<u32> {
    content.metadata.get(key).and_then(|v| v.to_u32())
}

fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper> {
    let split = |pattern: &str| -> Result<PreTokenizerWrapper> {
        Ok(Split::new(
            SplitPattern::Regex(pattern.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| EngineError::Tokenizer(e.to_string()))?
        .into())
    };
    let byte_level =
        |use_regex: bool| -> PreTokenizerWrapper { ByteLevel::new(false, false, use_regex).into() };
    Ok(match pre {
        "qwen2" => Sequence::new(vec![split(QWEN2_PATTERN)?, byte_level(false)]).into(),
        "qwen35" => Sequence::new(vec![split(QWEN35_PATTERN)?, byte_level(false)]).into(),
        "llama3" | "llama-bpe" | "smaug-bpe" | "lfm2" => {
            Sequence::new(vec![split(LLAMA3_PATTERN)?, byte_level(false)]).into()
        }
        "gpt-4o" | "llama4" => Sequence::new(vec![split(GPT4O_PATTERN)?, byte_level(false)]).into(),
        // Granite 3 names its StarCoder-style pre-tokenizer "refact": SmolLM's.
        "smollm" | "refact" => Sequence::new(vec![
            Digits::new(true).into(),
            split(GPT2_PATTERN)?,
            byte_level(false),
        ])
        .into(),
        // llama.cpp's own default: four splits in turn.
        "default" => Sequence::new(vec![
            split(r"[\p{P}\$\+<=>\^~\|]+")?,
            split(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)")?,
            split(r"\p{N}+")?,
            split(r"[0-9][0-9][0-9]")?,
            byte_level(false),
        ])
        .into(),
        other => {
            return Err(EngineError::Unsupported(format!(
                "pre-tokenizer {other:?} (supported: qwen2, qwen35, llama-bpe/llama3/smaug-bpe/lfm2, smollm, refact, gpt-4o/llama4, default)"
            )))
        }
    })
}

fn string_array(content: &Content, key: &str) -> Result<Vec<String>> {
    match content.metadata.get(key) {
        Some(Value::Array(v)) => v
            .iter()
            .map(|x| {
                x.to_str()
                    .map(str::to_owned)
                    .ok_or_else(|| EngineError::Gguf(format!("{key}: not a string")))
            })
            .collect(),
        _ => Err(EngineError::Gguf(format!("missing array {key}"))),
    }
}
