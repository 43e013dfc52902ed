//! Every response body of the API, as the types that are serialized and that the OpenAPI
//! description shows (`schema.rs` names them; nothing describes a response twice). Fields
//! are in the order clients see them.

use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use edgeprompt_engine::TokenLogprobs;

use super::request::{FunctionCall, ToolCall};
use crate::pipeline::LayerTiming;
use crate::prefixes::Named;
use crate::scheduler::Done;

/// Which API a generation answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

impl Kind {
    pub fn object(self, stream: bool) -> &'static str {
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

/// Tokens of all answers (the prompt counted once: the answers share it).
#[derive(Debug, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn of(done: &[&Done]) -> Self {
        let prompt = done.first().map_or(0, |d| d.prompt_tokens);
        let completion: usize = done.iter().map(|d| d.completion_tokens).sum();
        Self {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
        }
    }
}

/// What a choice's `logprobs` is built from: the answer's tokens, and for a completion that
/// echoes its prompt, the prompt's.
pub struct Scored<'a> {
    pub done: &'a Done,
    pub echo: Option<&'a Echo>,
    /// A token id's text.
    pub text: &'a dyn Fn(u32) -> String,
}

/// The prompt a completion echoes: its text and its tokens.
pub struct Echo {
    pub text: String,
    /// The tokens this request computed (and scores).
    pub ids: Vec<u32>,
    /// The tokens before them that a cloud prompt held here stood for: echoed, never scored
    /// (their logits exist only where the prompt was computed).
    pub shared: Vec<u32>,
}

/// One alternative of a chat token.
#[derive(Debug, Serialize, ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
}

/// One chat token, with its alternatives.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

/// A chat answer's `logprobs`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprob>,
}

impl ChatLogprobs {
    /// None when the request asked for none.
    pub fn of(s: &Scored) -> Option<Self> {
        if s.done.logprobs.is_empty() {
            return None;
        }
        let top = |id: u32, lp: f32| {
            let token = (s.text)(id);
            TopLogprob {
                bytes: token.as_bytes().to_vec(),
                token,
                logprob: lp.into(),
            }
        };
        let content = s
            .done
            .logprobs
            .iter()
            .map(|l| {
                let TopLogprob {
                    token,
                    logprob,
                    bytes,
                } = top(l.id, l.logprob);
                TokenLogprob {
                    token,
                    logprob,
                    bytes,
                    top_logprobs: l.top.iter().map(|&(i, lp)| top(i, lp)).collect(),
                }
            })
            .collect();
        Some(Self { content })
    }
}

/// A completion's `logprobs`: parallel lists that start with the echoed prompt's tokens
/// (`null` where a token has nothing before it).
#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f64>>,
    /// Each token's alternatives, text to log-probability.
    #[schema(value_type = Vec<Option<Object>>)]
    pub top_logprobs: Vec<Option<Map<String, Value>>>,
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// None when the request asked for none.
    pub fn of(s: &Scored) -> Option<Self> {
        let prompt: Vec<(u32, Option<&TokenLogprobs>)> = match s.echo {
            Some(e) if s.done.prompt_logprobs.len() == e.ids.len() => e
                .shared
                .iter()
                .map(|&id| (id, None))
                .chain(
                    e.ids
                        .iter()
                        .zip(&s.done.prompt_logprobs)
                        .map(|(&id, l)| (id, l.as_ref())),
                )
                .collect(),
            _ => Vec::new(),
        };
        if s.done.logprobs.is_empty() && prompt.is_empty() {
            return None;
        }
        let all: Vec<(u32, Option<&TokenLogprobs>)> = prompt
            .into_iter()
            .chain(s.done.logprobs.iter().map(|l| (l.id, Some(l))))
            .collect();
        let tokens: Vec<String> = all.iter().map(|&(id, _)| (s.text)(id)).collect();
        let mut offset = 0;
        let text_offset = tokens
            .iter()
            .map(|t| {
                let at = offset;
                offset += t.len();
                at
            })
            .collect();
        Some(Self {
            token_logprobs: all
                .iter()
                .map(|(_, l)| l.map(|l| l.logprob.into()))
                .collect(),
            top_logprobs: all
                .iter()
                .map(|(_, l)| {
                    l.map(|l| {
                        l.top
                            .iter()
                            .map(|&(i, lp)| ((s.text)(i), lp.into()))
                            .collect()
                    })
                })
                .collect(),
            tokens,
            text_offset,
        })
    }
}

/// The assistant's turn in a finished chat answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// Null when the answer is only tool calls.
    pub content: Option<String>,
    /// The answer's calls, when the request gave `tools` and the answer made some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: &'static str,
    pub logprobs: Option<ChatLogprobs>,
}

/// A finished chat answer (`stream: false`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    pub edgeprompt: EdgepromptBlock,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    /// `stop` or `length`; null on a streamed chunk that does not end the answer.
    pub finish_reason: Option<&'static str>,
    pub logprobs: Option<CompletionLogprobs>,
}

/// A finished completion (`stream: false`).
#[derive(Debug, Serialize, ToSchema)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: Usage,
    pub edgeprompt: EdgepromptBlock,
}

/// One whole tool call in a streamed delta.
#[derive(Debug, Serialize, ToSchema)]
pub struct ToolCallDelta {
    pub index: usize,
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Default, Serialize, ToSchema)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub finish_reason: Option<&'static str>,
    pub logprobs: Option<ChatLogprobs>,
}

/// One streamed chat event's data.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    /// The last chunk, when `stream_options.include_usage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// On the chunk that finishes an answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edgeprompt: Option<EdgepromptBlock>,
}

/// One streamed completion event's data.
#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edgeprompt: Option<EdgepromptBlock>,
}

/// The request's cloud prompt: where its KV came from and what crossed the network for it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CloudPromptOrigin {
    /// The `cloud_prompt` id it was named by (null: found by its system text).
    pub id: Option<String>,
    pub tokens: usize,
    /// `memory`, `disk`, `peer`, `store`, `cloud` or `local` (computed on this edge).
    pub source: &'static str,
    /// Bytes this edge sent for it: a prompt reference, never private text (protobuf
    /// message bytes; every request that joined one fetch reports that fetch).
    pub bytes_up: usize,
    /// Bytes it received for it: the header and the KV.
    pub bytes_down: usize,
}

/// What makes the answer EdgePrompt's: what stayed here, what came over the network, when.
#[derive(Debug, Serialize, ToSchema)]
pub struct EdgepromptBlock {
    pub cloud_prompt: Option<CloudPromptOrigin>,
    /// The request's whole private prompt, computed here and never sent.
    pub private_tokens: usize,
    /// Of those, the tokens earlier turns computed (the private prefix cache).
    pub private_cached_tokens: usize,
    /// Seconds from the request's arrival to its admission (the lookup, the grammar).
    pub admitted_s: f64,
    /// Seconds from arrival to the first token.
    pub ttft_s: Option<f64>,
    /// On a cold cloud prompt: when each cloud layer landed and each private layer ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<LayerTiming>>,
}

/// OpenAI's error detail.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    /// In a stream that had begun: the status the request would have had.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

/// Every error: OpenAI's shape.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

impl ErrorBody {
    pub fn new(status: u16, message: &str, code: Option<&'static str>) -> Self {
        let kind = match status {
            400 | 401 | 413 => "invalid_request_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            504 => "timeout_error",
            _ => "server_error",
        };
        Self {
            error: ErrorDetail {
                message: message.to_string(),
                kind,
                param: None,
                code,
                status: None,
            },
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// Longest prompt + answer a request may use (the names clients read).
    pub context_length: usize,
    pub max_model_len: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CloudPromptList {
    pub object: &'static str,
    pub data: Vec<Named>,
    /// `none`, `reachable` or `unreachable`.
    pub cloud: &'static str,
    /// Why the cloud did not list its prompts (the ids held here are listed still).
    pub cloud_error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`, `draining`, `key_conflict` or `dead`.
    pub status: &'static str,
    pub pending_requests: usize,
    pub model: String,
    pub fingerprint: String,
    pub active_sequences: usize,
    /// Why the scheduler died, or which two keys conflict (with 503).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Default, Serialize, ToSchema)]
pub struct Ready {
    pub ready: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draining: Option<bool>,
    /// `none`, `reachable` or `unreachable`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cloud: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_compute: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Tokenized {
    pub tokens: Vec<u32>,
    pub count: usize,
    pub max_model_len: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Detokenized {
    /// The text (llama-server's name).
    pub content: String,
    /// The same text (vLLM's name).
    pub prompt: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TokenizerInfo {
    pub model: String,
    pub vocab_size: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub max_model_len: usize,
    pub has_chat_template: bool,
}
