//! The OpenAPI description of the HTTP API (`GET /openapi.json`): the request schemas are the
//! request types themselves (`openai.rs`); the responses are described by the types below,
//! which name every field the handlers write. `schemathesis` checks the running server against
//! it (`scripts/openapi_check.sh`).

use serde_json::Value;
use utoipa::{OpenApi, ToSchema};

use super::openai::{ChatRequest, CompletionRequest};
use super::tokens::{DetokenizeRequest, TokenizeRequest};

/// Chat's `logprobs` is `true`/`false`; completions' is how many alternatives per token.
#[derive(ToSchema, serde::Serialize)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum LogprobsParam {
    Chat(bool),
    Completion(u32),
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct AssistantMessage {
    role: String,
    /// Null when the answer is only tool calls.
    content: Option<String>,
    /// The answer's calls, when the request gave `tools`.
    tool_calls: Option<Vec<super::openai::ToolCall>>,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct ChatChoice {
    index: u64,
    message: AssistantMessage,
    finish_reason: Option<String>,
    /// `{"content": [{token, logprob, bytes, top_logprobs}]}` when asked for.
    #[schema(value_type = Option<Object>)]
    logprobs: Option<Value>,
}

/// The request's cloud prompt: where its KV came from and what crossed the network for it.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct CloudPromptOrigin {
    /// The `cloud_prompt` id it was named by (null: found by its system text).
    id: Option<String>,
    tokens: u64,
    /// `memory`, `disk`, `peer`, `cloud` or `local` (computed on this edge).
    source: String,
    /// Bytes this edge sent for it: a prompt reference, never private text (protobuf
    /// message bytes; every request that joined one fetch reports that fetch).
    bytes_up: u64,
    /// Bytes it received for it: the header and the KV.
    bytes_down: u64,
}

/// One layer of a cold cloud prompt: seconds since admission.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct LayerTiming {
    layer: u64,
    arrived: f64,
    compute_start: f64,
    compute_end: f64,
    wire_bytes: u64,
}

/// What makes the answer EdgePrompt's: what stayed here, what came over the network, when.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct EdgepromptBlock {
    cloud_prompt: Option<CloudPromptOrigin>,
    /// The request's own prompt tokens, computed here and never sent.
    private_tokens: u64,
    /// Seconds from the request's arrival to its admission (the lookup, the grammar).
    admitted_s: f64,
    /// Seconds from arrival to the first token.
    ttft_s: Option<f64>,
    /// On a cold cloud prompt: when each cloud layer landed and each private layer ran.
    timeline: Option<Vec<LayerTiming>>,
}

/// A finished chat answer (`stream: false`).
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct ChatCompletion {
    id: String,
    object: String,
    created: u64,
    model: String,
    choices: Vec<ChatChoice>,
    usage: Usage,
    edgeprompt: EdgepromptBlock,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct CompletionChoice {
    index: u64,
    text: String,
    finish_reason: Option<String>,
    /// `{tokens, token_logprobs, top_logprobs, text_offset}` when asked for.
    #[schema(value_type = Option<Object>)]
    logprobs: Option<Value>,
}

/// A finished completion (`stream: false`).
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct Completion {
    id: String,
    object: String,
    created: u64,
    model: String,
    choices: Vec<CompletionChoice>,
    usage: Usage,
    edgeprompt: EdgepromptBlock,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct Delta {
    role: Option<String>,
    content: Option<String>,
    /// One whole call: `[{"index", "id", "type", "function": {"name", "arguments"}}]`.
    #[schema(value_type = Option<Vec<Object>>)]
    tool_calls: Option<Value>,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct ChatChunkChoice {
    index: u64,
    delta: Delta,
    finish_reason: Option<String>,
    #[schema(value_type = Option<Object>)]
    logprobs: Option<Value>,
}

/// One streamed chat event's data.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct ChatCompletionChunk {
    id: String,
    object: String,
    created: u64,
    model: String,
    choices: Vec<ChatChunkChoice>,
    /// The last chunk, when `stream_options.include_usage`.
    usage: Option<Usage>,
    /// On the chunk that finishes an answer.
    edgeprompt: Option<EdgepromptBlock>,
}

/// One streamed completion event's data.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct CompletionChunk {
    id: String,
    object: String,
    created: u64,
    model: String,
    choices: Vec<CompletionChoice>,
    usage: Option<Usage>,
    edgeprompt: Option<EdgepromptBlock>,
}

/// One server-sent event of a streamed answer.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct StreamEvent {
    /// A `ChatCompletionChunk` or `CompletionChunk` as JSON, an `ErrorBody` that ends the
    /// stream, or `[DONE]`.
    data: String,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct ErrorDetail {
    message: String,
    r#type: String,
    param: Option<String>,
    code: Option<String>,
}

/// Every error: OpenAI's shape.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct ModelCard {
    id: String,
    object: String,
    created: u64,
    owned_by: String,
    /// Longest prompt + answer a request may use.
    context_length: u64,
    max_model_len: u64,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct ModelList {
    object: String,
    data: Vec<ModelCard>,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct Health {
    /// `ok`, `draining`, `key_conflict` or `dead`.
    status: String,
    pending_requests: u64,
    model: String,
    fingerprint: String,
    active_sequences: u64,
    /// Why the scheduler died, or which two keys conflict (with 503).
    reason: Option<String>,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct Ready {
    ready: bool,
    draining: Option<bool>,
    /// `none`, `reachable` or `unreachable`.
    cloud: Option<String>,
    local_compute: Option<bool>,
    dead: Option<bool>,
    reason: Option<String>,
}

/// How a generation request is refused or ended (OpenAI's error body each time).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
enum Refusals {
    #[response(status = 400, description = "A request the server cannot serve")]
    BadRequest(ErrorBody),
    #[response(status = 401, description = "No or a wrong API key")]
    Unauthorized(ErrorBody),
    #[response(
        status = 404,
        description = "Another model, or an unknown cloud prompt"
    )]
    NotFound(ErrorBody),
    #[response(
        status = 413,
        description = "A body larger than the model's context could hold"
    )]
    TooLarge(ErrorBody),
    #[response(status = 422, description = "A body that is not the request")]
    Unprocessable(ErrorBody),
    #[response(
        status = 429,
        description = "KV budget, queue or prompts computed here full; retry later"
    )]
    Busy(ErrorBody),
    #[response(status = 500, description = "An internal fault ended this request")]
    Fault(ErrorBody),
    #[response(status = 502, description = "The cloud prompt could not be had")]
    BadGateway(ErrorBody),
    #[response(status = 503, description = "Draining, or the scheduler is dead")]
    Unavailable(ErrorBody),
    #[response(status = 504, description = "The request timed out")]
    Timeout(ErrorBody),
}

/// Answers a chat; `stream: true` sends `chat.completion.chunk` events, then `[DONE]`.
#[utoipa::path(post, path = "/v1/chat/completions", request_body = ChatRequest,
    responses(
        (status = 200, description = "The answer", content(
            (ChatCompletion = "application/json"),
            (StreamEvent = "text/event-stream"))),
        Refusals,
    ))]
#[allow(dead_code)]
fn chat() {}

/// Completes a prompt; `stream: true` sends `text_completion` events, then `[DONE]`.
#[utoipa::path(post, path = "/v1/completions", request_body = CompletionRequest,
    responses(
        (status = 200, description = "The answer", content(
            (Completion = "application/json"),
            (StreamEvent = "text/event-stream"))),
        Refusals,
    ))]
#[allow(dead_code)]
fn completions() {}

/// The model this edge serves.
#[utoipa::path(get, path = "/v1/models", responses(
    (status = 200, description = "One model", body = ModelList),
    (status = 401, description = "No or a wrong API key", body = ErrorBody),
    (status = 503, description = "Draining, or the scheduler is dead", body = ErrorBody),
))]
#[allow(dead_code)]
fn models() {}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct NamedPrompt {
    id: String,
    tokens: u64,
    /// Its KV is in this edge's memory.
    in_memory: bool,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct CloudPromptList {
    object: String,
    data: Vec<NamedPrompt>,
    /// `none`, `reachable` or `unreachable`.
    cloud: String,
    /// Why the cloud did not list its prompts (the ids held here are listed still).
    cloud_error: Option<String>,
}

/// The cloud prompts a request may name (`cloud_prompt`): the cloud's and those held here.
#[utoipa::path(get, path = "/v1/cloud_prompts", responses(
    (status = 200, description = "The prompts", body = CloudPromptList),
    (status = 401, description = "No or a wrong API key", body = ErrorBody),
    (status = 503, description = "Draining, or the scheduler is dead", body = ErrorBody),
))]
#[allow(dead_code)]
fn cloud_prompts() {}

/// Alive (200, draining or not), or dead or in a key conflict (503, with the reason).
#[utoipa::path(get, path = "/health", responses(
    (status = 200, description = "Serving", body = Health),
    (status = 503, description = "The scheduler is dead, or the cloud shows another signing key than the pinned one", body = Health),
))]
#[allow(dead_code)]
fn health() {}

/// Whether a new request can be served now.
#[utoipa::path(get, path = "/ready", responses(
    (status = 200, description = "Ready", body = Ready),
    (status = 503, description = "Draining, cloud unreachable, or dead", body = Ready),
))]
#[allow(dead_code)]
fn ready() {}

/// The chat page.
#[utoipa::path(get, path = "/", responses(
    (status = 200, description = "The page", content((String = "text/html"))),
))]
#[allow(dead_code)]
fn page() {}

/// The chat page's script.
#[utoipa::path(get, path = "/page.js", responses(
    (status = 200, description = "The script", content((String = "text/javascript"))),
))]
#[allow(dead_code)]
fn page_script() {}

/// Prometheus metrics (OpenMetrics text).
#[utoipa::path(get, path = "/metrics", responses(
    (status = 200, description = "Metrics", content((String = "application/openmetrics-text"))),
    (status = 401, description = "API keys are set and no admin key was sent", body = ErrorBody),
))]
#[allow(dead_code)]
fn metrics() {}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct Tokenized {
    tokens: Vec<u32>,
    count: u64,
    max_model_len: u64,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct Detokenized {
    /// The text (llama-server's name).
    content: String,
    /// The same text (vLLM's name).
    prompt: String,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
struct TokenizerInfo {
    model: String,
    vocab_size: u64,
    bos_token_id: Option<u32>,
    eos_token_id: Option<u32>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    max_model_len: u64,
    has_chat_template: bool,
}

/// Token ids of a text (BOS added where the model wants one unless `add_special` is false).
#[utoipa::path(post, path = "/tokenize", request_body = TokenizeRequest, responses(
    (status = 200, description = "The ids", body = Tokenized),
    (status = 400, description = "No text, or not the request", body = ErrorBody),
    (status = 413, description = "A text larger than the model's context could hold", body = ErrorBody),
    (status = 401, description = "No or a wrong API key", body = ErrorBody),
    (status = 503, description = "Draining, or the scheduler is dead", body = ErrorBody),
))]
#[allow(dead_code)]
fn tokenize() {}

/// The text of token ids.
#[utoipa::path(post, path = "/detokenize", request_body = DetokenizeRequest, responses(
    (status = 200, description = "The text", body = Detokenized),
    (status = 400, description = "An id past the vocabulary, or not the request", body = ErrorBody),
    (status = 413, description = "More ids than the model's context could hold", body = ErrorBody),
    (status = 401, description = "No or a wrong API key", body = ErrorBody),
    (status = 503, description = "Draining, or the scheduler is dead", body = ErrorBody),
))]
#[allow(dead_code)]
fn detokenize() {}

/// The tokenizer's vocabulary size and special tokens.
#[utoipa::path(get, path = "/tokenizer_info", responses(
    (status = 200, description = "The tokenizer", body = TokenizerInfo),
    (status = 401, description = "No or a wrong API key", body = ErrorBody),
    (status = 503, description = "Draining, or the scheduler is dead", body = ErrorBody),
))]
#[allow(dead_code)]
fn tokenizer_info() {}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "EdgePrompt edge",
        description = "OpenAI-compatible API of an EdgePrompt edge: the leading system message is the cloud prompt (its KV from the cloud), the rest stays on the edge."
    ),
    paths(
        chat,
        completions,
        models,
        cloud_prompts,
        page,
        page_script,
        health,
        ready,
        metrics,
        tokenize,
        detokenize,
        tokenizer_info
    ),
    components(schemas(ChatCompletionChunk, CompletionChunk))
)]
pub struct ApiDoc;

/// The description as JSON; with `model`, the one model name this server takes.
pub fn openapi_json(model: Option<&str>) -> String {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    if let Some(m) = model {
        doc["components"]["schemas"]["Sampling"]["properties"]["model"]["enum"] =
            serde_json::json!([m]);
    }
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_names_every_route_and_the_request_fields() {
        let doc: Value = serde_json::from_str(&openapi_json(Some("m"))).unwrap();
        assert_eq!(
            doc["components"]["schemas"]["Sampling"]["properties"]["model"]["enum"][0],
            "m"
        );
        for p in [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/models",
            "/health",
            "/ready",
            "/metrics",
        ] {
            assert!(doc["paths"][p].is_object(), "{p}");
        }
        let text = doc.to_string();
        for field in [
            "max_tokens",
            "cloud_prompt",
            "messages",
            "top_logprobs",
            "stop",
        ] {
            assert!(text.contains(field), "{field}");
        }
    }
}
