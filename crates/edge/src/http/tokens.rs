//! The model's tokenizer over HTTP, in the shapes llama-server and vLLM use, so clients and
//! evaluation harnesses can count and build token-id prompts on the server: `POST /tokenize`,
//! `POST /detokenize`, `GET /tokenizer_info`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::handlers::{body_of, parse, text_of};
use super::{ApiError, EdgeServer};

type AppState = State<std::sync::Arc<EdgeServer>>;

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

pub async fn tokenize(State(s): AppState, body: Result<Bytes, BytesRejection>) -> Response {
    let body = match body_of(body) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let _gate = match s.gate(body.len()).await {
        Ok(g) => g,
        Err(e) => return e.into_response(),
    };
    let run = || -> Result<Response, ApiError> {
        let r: TokenizeRequest = parse(&body)?;
        let text = r
            .content
            .or(r.prompt)
            .ok_or_else(|| ApiError::bad_request("send `content` (or `prompt`)"))?;
        let t = &s.model.tokenizer;
        let special = r.add_special.or(r.add_special_tokens).unwrap_or(true);
        let ids = match special {
            true => t.encode_prompt(&text),
            false => t.encode(&text),
        }
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let body = json!({
            "tokens": ids,
            "count": ids.len(),
            "max_model_len": s.model.max_positions(),
        });
        Ok(Json(body).into_response())
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

pub async fn detokenize(State(s): AppState, body: Result<Bytes, BytesRejection>) -> Response {
    let run = || -> Result<Response, ApiError> {
        let r: DetokenizeRequest = parse(&body_of(body)?)?;
        let text = text_of(&s.model, &r.tokens)?;
        Ok(Json(json!({"content": text, "prompt": text})).into_response())
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

pub async fn tokenizer_info(State(s): AppState) -> Response {
    let t = &s.model.tokenizer;
    let text = |id: Option<u32>| id.and_then(|i| t.token_text(i));
    Json(json!({
        "model": s.cfg.model_id,
        "vocab_size": t.vocab_size(),
        "bos_token_id": t.bos_id,
        "eos_token_id": t.eos_id,
        "bos_token": text(t.bos_id),
        "eos_token": text(t.eos_id),
        "max_model_len": s.model.max_positions(),
        "has_chat_template": s.model.chat.is_some(),
    }))
    .into_response()
}
