//! Every request body of the API, as clients send it (unknown fields ignored): OpenAI's chat
//! and completions, and the tokenizer's. These types are also the OpenAPI description's
//! request schemas. `validation.rs` turns them into requests the edge can run.

use serde::Deserialize;
use serde_json::Value;

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
    #[schema(value_type = Option<LogprobsParam>)]
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

/// Chat's `logprobs` is `true`/`false`; completions' is how many alternatives per token.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum LogprobsParam {
    Chat(bool),
    Completion(u32),
}

/// `POST /tokenize`: `content` (llama-server) or `prompt` (vLLM).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct TokenizeRequest {
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub prompt: Option<String>,
    /// Add the model's BOS where it wants one (llama-server's `add_special`, vLLM's
    /// `add_special_tokens`; default true).
    #[serde(default)]
    pub add_special: Option<bool>,
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct DetokenizeRequest {
    pub tokens: Vec<u32>,
}
