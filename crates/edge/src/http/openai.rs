//! The OpenAI wire format: request bodies (unknown fields ignored) and response objects.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::scheduler::Done;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

impl Content {
    /// Text content; parts other than text are refused.
    pub fn text(self) -> Result<String, String> {
        match self {
            Content::Text(s) => Ok(s),
            Content::Parts(parts) => parts
                .into_iter()
                .map(|p| match (p.kind.as_str(), p.text) {
                    ("text", Some(t)) => Ok(t),
                    (k, _) => Err(format!("content parts of type {k:?} are not supported")),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

#[derive(Debug, Deserialize, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// What both endpoints share.
#[derive(Debug, Deserialize)]
pub struct Sampling {
    pub model: String,
    #[serde(default)]
    pub max_tokens: Option<usize>,
    #[serde(default)]
    pub max_completion_tokens: Option<usize>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Not in OpenAI's API, accepted as vLLM and llama.cpp do.
    #[serde(default)]
    pub top_k: Option<usize>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub n: Option<usize>,
    /// EdgePrompt's extension: a registered cloud prompt by id.
    #[serde(default)]
    pub cloud_prompt: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub common: Sampling,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptText {
    One(String),
    Batch(Vec<String>),
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptText,
    #[serde(flatten)]
    pub common: Sampling,
}

pub fn usage(d: &Done) -> Value {
    json!({
        "prompt_tokens": d.prompt_tokens,
        "completion_tokens": d.completion_tokens,
        "total_tokens": d.prompt_tokens + d.completion_tokens,
    })
}

/// The response of a finished request.
pub fn response(kind: Kind, id: &str, created: u64, model: &str, text: &str, d: &Done) -> Value {
    let choice = match kind {
        Kind::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": d.finish_reason,
            "logprobs": null,
        }),
        Kind::Completion => json!({
            "index": 0,
            "text": text,
            "finish_reason": d.finish_reason,
            "logprobs": null,
        }),
    };
    json!({
        "id": id,
        "object": kind.object(false),
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(d),
    })
}

/// One streamed chunk: a text delta, the opening role, or the closing finish reason.
pub fn chunk(
    kind: Kind,
    id: &str,
    created: u64,
    model: &str,
    text: Option<&str>,
    role: bool,
    finish: Option<&str>,
) -> Value {
    let choice = match kind {
        Kind::Chat => {
            let mut delta = serde_json::Map::new();
            if role {
                delta.insert("role".into(), "assistant".into());
            }
            if let Some(t) = text {
                delta.insert("content".into(), t.into());
            }
            json!({"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null})
        }
        Kind::Completion => {
            json!({"index": 0, "text": text.unwrap_or(""), "finish_reason": finish, "logprobs": null})
        }
    };
    json!({
        "id": id,
        "object": kind.object(true),
        "created": created,
        "model": model,
        "choices": [choice],
    })
}

/// The last chunk when the client asked for usage in the stream.
pub fn usage_chunk(kind: Kind, id: &str, created: u64, model: &str, d: &Done) -> Value {
    json!({
        "id": id,
        "object": kind.object(true),
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(d),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

impl Kind {
    fn object(self, stream: bool) -> &'static str {
        match (self, stream) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    pub fn id_prefix(self) -> &'static str {
        match self {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        }
    }

    pub fn endpoint(self) -> &'static str {
        match self {
            Kind::Chat => "/v1/chat/completions",
            Kind::Completion => "/v1/completions",
        }
    }
}

pub fn error_body(status: u16, message: &str, code: Option<&str>) -> Value {
    let kind = match status {
        400 | 401 | 413 => "invalid_request_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        504 => "timeout_error",
        _ => "server_error",
    };
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}
