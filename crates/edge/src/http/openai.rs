//! The OpenAI wire format: request bodies (unknown fields ignored) and response objects.

use serde::Deserialize;
use serde_json::{json, Value};

use edgeprompt_engine::TokenLogprobs;

use crate::scheduler::Done;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
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

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
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

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant turn's calls (`[{"id", "type": "function", "function": {"name",
    /// "arguments"}}]`, `arguments` a JSON string).
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// A `tool` turn: the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, utoipa::ToSchema)]
pub struct ToolCall {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, utoipa::ToSchema)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as a JSON text.
    pub arguments: String,
}

fn function_type() -> String {
    "function".into()
}

/// A function the model may call.
#[derive(Debug, Clone, Deserialize, serde::Serialize, utoipa::ToSchema)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, utoipa::ToSchema)]
pub struct FunctionDef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON schema of the arguments object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `"none"`, `"auto"`, `"required"`, or `{"type": "function", "function": {"name": ...}}`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    Named(NamedTool),
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct NamedTool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: NamedFunction,
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct NamedFunction {
    pub name: String,
}

/// `{"type": "text"}`, `{"type": "json_object"}`, or `{"type": "json_schema", "json_schema":
/// {"name", "schema", "strict"}}`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub json_schema: Option<JsonSchemaFormat>,
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct JsonSchemaFormat {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub schema: Option<Value>,
    #[serde(default)]
    pub strict: Option<bool>,
}

#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// What both endpoints share.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct Sampling {
    /// The served model's id; absent means that model (as llama.cpp's servers take it).
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub max_tokens: Option<usize>,
    #[serde(default)]
    pub max_completion_tokens: Option<usize>,
    #[serde(default)]
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f32>,
    #[serde(default)]
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
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
    #[schema(minimum = 1, maximum = 16)]
    pub n: Option<usize>,
    /// Chat: `true`/`false`; completions: how many alternatives per token (0-20).
    #[serde(default)]
    #[schema(value_type = Option<crate::http::schema::LogprobsParam>)]
    pub logprobs: Option<Value>,
    /// Chat: alternatives per token (0-20) when `logprobs` is true.
    #[serde(default)]
    #[schema(maximum = 20)]
    pub top_logprobs: Option<usize>,
    /// Completions: answer the prompt too (with `logprobs`, each prompt token scored;
    /// `max_tokens` 0 then scores the prompt only). After a cloud prompt, the prompt is this
    /// request's part: its first token is scored from the cloud prompt's last position.
    #[serde(default)]
    pub echo: Option<bool>,
    /// EdgePrompt's extension: a registered cloud prompt by id.
    #[serde(default)]
    pub cloud_prompt: Option<String>,
    /// The answer's form: free text, any JSON object, or JSON valid under a schema.
    #[serde(default)]
    pub response_format: Option<ResponseFormat>,
    /// Not in OpenAI's API: a grammar the answer must match, in llguidance's Lark syntax
    /// (`start: ...`; `/regex/` terminals; `%json {schema}`).
    #[serde(default)]
    pub grammar: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ChatRequest {
    #[schema(min_items = 1)]
    pub messages: Vec<ChatMessage>,
    /// Functions the model may call; the answer's calls come back as `tool_calls`.
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    /// False: at most one call per answer.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// Scopes this conversation's private prefix cache (as vLLM takes it): a turn reuses the
    /// KV of earlier turns only from requests with the same API key and the same salt.
    #[serde(default)]
    #[schema(max_length = 256)]
    pub cache_salt: Option<String>,
    #[serde(flatten)]
    pub common: Sampling,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum PromptText {
    One(String),
    Batch(Vec<String>),
    /// Token ids, taken as they are (no BOS added), as OpenAI, vLLM and llama-server take them.
    Ids(Vec<u32>),
    IdBatch(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct CompletionRequest {
    pub prompt: PromptText,
    #[serde(flatten)]
    pub common: Sampling,
}

/// Tokens of all answers (the prompt counted once: the answers share it).
pub fn usage(done: &[&Done]) -> Value {
    let prompt = done.first().map_or(0, |d| d.prompt_tokens);
    let completion: usize = done.iter().map(|d| d.completion_tokens).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
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

/// OpenAI's `logprobs` object of a choice (`null` when none were asked for): chat's
/// `{"content": [{token, logprob, bytes, top_logprobs}]}` or completions' parallel lists,
/// which start with the echoed prompt's tokens (`null` where a token has nothing before it).
/// `text` gives a token id's text.
pub fn logprobs_json(
    kind: Kind,
    echo: Option<&Echo>,
    done: &Done,
    text: &dyn Fn(u32) -> String,
) -> Value {
    let lps = &done.logprobs;
    let prompt: Vec<(u32, Option<&TokenLogprobs>)> = match echo {
        Some(e) if done.prompt_logprobs.len() == e.ids.len() => e
            .shared
            .iter()
            .map(|&id| (id, None))
            .chain(
                e.ids
                    .iter()
                    .zip(&done.prompt_logprobs)
                    .map(|(&id, l)| (id, l.as_ref())),
            )
            .collect(),
        _ => Vec::new(),
    };
    if lps.is_empty() && prompt.is_empty() {
        return Value::Null;
    }
    match kind {
        Kind::Chat => {
            let entry = |id: u32, lp: f32| {
                let t = text(id);
                json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
            };
            let content: Vec<Value> = lps
                .iter()
                .map(|l| {
                    let mut e = entry(l.id, l.logprob);
                    e["top_logprobs"] = l.top.iter().map(|&(i, lp)| entry(i, lp)).collect();
                    e
                })
                .collect();
            json!({ "content": content })
        }
        Kind::Completion => {
            let all: Vec<(u32, Option<&TokenLogprobs>)> = prompt
                .into_iter()
                .chain(lps.iter().map(|l| (l.id, Some(l))))
                .collect();
            let tokens: Vec<String> = all.iter().map(|&(id, _)| text(id)).collect();
            let mut offset = 0;
            let offsets: Vec<usize> = tokens
                .iter()
                .map(|t| {
                    let at = offset;
                    offset += t.len();
                    at
                })
                .collect();
            let top: Vec<Value> = all
                .iter()
                .map(|(_, l)| match l {
                    Some(l) => {
                        let m: serde_json::Map<String, Value> =
                            l.top.iter().map(|&(i, lp)| (text(i), lp.into())).collect();
                        Value::Object(m)
                    }
                    None => Value::Null,
                })
                .collect();
            let values: Vec<Option<f32>> = all.iter().map(|(_, l)| l.map(|l| l.logprob)).collect();
            json!({
                "tokens": tokens,
                "token_logprobs": values,
                "top_logprobs": top,
                "text_offset": offsets,
            })
        }
    }
}

/// One finished answer: its text, how it ended, and its `logprobs` object.
pub struct Answer<'a> {
    pub text: &'a str,
    pub done: &'a Done,
    pub logprobs: Value,
    /// Read calls to these functions out of the text.
    pub tool_calls: Option<&'a [String]>,
}

/// The response of a finished request, one choice per answer.
pub fn response(kind: Kind, id: &str, created: u64, model: &str, answers: &[Answer]) -> Value {
    let choices: Vec<Value> = answers
        .iter()
        .enumerate()
        .map(|(i, a)| match kind {
            Kind::Chat if a.tool_calls.is_some() => {
                let names = a.tool_calls.unwrap_or_default();
                let (content, calls) = super::tools::split_calls(a.text, names);
                let mut message = json!({"role": "assistant", "content": content});
                let mut reason = a.done.finish_reason;
                if !calls.is_empty() {
                    message["tool_calls"] = json!(calls);
                    if reason == "stop" {
                        reason = "tool_calls";
                    }
                }
                json!({
                    "index": i,
                    "message": message,
                    "finish_reason": reason,
                    "logprobs": a.logprobs,
                })
            }
            Kind::Chat => json!({
                "index": i,
                "message": {"role": "assistant", "content": a.text},
                "finish_reason": a.done.finish_reason,
                "logprobs": a.logprobs,
            }),
            Kind::Completion => json!({
                "index": i,
                "text": a.text,
                "finish_reason": a.done.finish_reason,
                "logprobs": a.logprobs,
            }),
        })
        .collect();
    let done: Vec<&Done> = answers.iter().map(|a| a.done).collect();
    json!({
        "id": id,
        "object": kind.object(false),
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(&done),
    })
}

/// What one streamed chunk carries for choice `index`: a text delta, the opening role, or
/// the closing finish reason (with the answer's `logprobs`, which come whole at the end).
pub struct Piece<'a> {
    pub index: usize,
    pub text: Option<&'a str>,
    pub role: bool,
    pub finish: Option<&'a str>,
    pub logprobs: Value,
}

impl<'a> Piece<'a> {
    pub fn new(
        index: usize,
        text: Option<&'a str>,
        role: bool,
        finish: Option<&'a str>,
        logprobs: Value,
    ) -> Self {
        Self {
            index,
            text,
            role,
            finish,
            logprobs,
        }
    }
}

/// One streamed chunk.
pub fn chunk(kind: Kind, id: &str, created: u64, model: &str, p: Piece) -> Value {
    let choice = match kind {
        Kind::Chat => {
            let mut delta = serde_json::Map::new();
            if p.role {
                delta.insert("role".into(), "assistant".into());
            }
            if let Some(t) = p.text {
                delta.insert("content".into(), t.into());
            }
            json!({"index": p.index, "delta": delta, "finish_reason": p.finish, "logprobs": p.logprobs})
        }
        Kind::Completion => {
            json!({"index": p.index, "text": p.text.unwrap_or(""), "finish_reason": p.finish, "logprobs": p.logprobs})
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

/// A streamed chat chunk carrying answer `index`'s `k`th tool call, whole.
pub fn tool_call_chunk(
    id: &str,
    created: u64,
    model: &str,
    index: usize,
    k: usize,
    call: &ToolCall,
) -> Value {
    json!({
        "id": id,
        "object": Kind::Chat.object(true),
        "created": created,
        "model": model,
        "choices": [{
            "index": index,
            "delta": {"tool_calls": [{
                "index": k,
                "id": call.id,
                "type": call.kind,
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }]},
            "finish_reason": null,
            "logprobs": null,
        }],
    })
}

/// The last chunk when the client asked for usage in the stream.
pub fn usage_chunk(kind: Kind, id: &str, created: u64, model: &str, done: &[&Done]) -> Value {
    json!({
        "id": id,
        "object": kind.object(true),
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(done),
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
