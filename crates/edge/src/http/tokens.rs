//! The model's tokenizer over HTTP, in the shapes llama-server and vLLM use, so clients and
//! evaluation harnesses can count and build token-id prompts on the server: `POST /tokenize`,
//! `POST /detokenize`, `GET /tokenizer_info`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::error::ApiError;
use super::request::{DetokenizeRequest, TokenizeRequest};
use super::response::{Detokenized, ErrorBody, Tokenized, TokenizerInfo};
use super::validation::{body_of, parse, text_of};
use super::EdgeServer;

type AppState = State<Arc<EdgeServer>>;

/// Token ids of a text (BOS added where the model wants one unless `add_special` is false).
#[utoipa::path(post, path = "/tokenize", request_body = TokenizeRequest, responses(
    (status = 200, description = "The ids", body = Tokenized),
    (status = 400, description = "No text, or not the request", body = ErrorBody),
    (status = 413, description = "A text larger than the model's context could hold", body = ErrorBody),
    (status = 401, description = "No or a wrong API key", body = ErrorBody),
    (status = 503, description = "Draining, or the scheduler is dead", body = ErrorBody),
))]
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
        Ok(Json(Tokenized {
            count: ids.len(),
            tokens: ids,
            max_model_len: s.model.max_positions(),
        })
        .into_response())
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// The text of token ids.
#[utoipa::path(post, path = "/detokenize", request_body = DetokenizeRequest, responses(
    (status = 200, description = "The text", body = Detokenized),
    (status = 400, description = "An id past the vocabulary, or not the request", body = ErrorBody),
    (status = 413, description = "More ids than the model's context could hold", body = ErrorBody),
    (status = 401, description = "No or a wrong API key", body = ErrorBody),
    (status = 503, description = "Draining, or the scheduler is dead", body = ErrorBody),
))]
pub async fn detokenize(State(s): AppState, body: Result<Bytes, BytesRejection>) -> Response {
    let run = || -> Result<Response, ApiError> {
        let r: DetokenizeRequest = parse(&body_of(body)?)?;
        let text = text_of(&s.model, &r.tokens)?;
        Ok(Json(Detokenized {
            content: text.clone(),
            prompt: text,
        })
        .into_response())
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// The tokenizer's vocabulary size and special tokens.
#[utoipa::path(get, path = "/tokenizer_info", responses(
    (status = 200, description = "The tokenizer", body = TokenizerInfo),
    (status = 401, description = "No or a wrong API key", body = ErrorBody),
    (status = 503, description = "Draining, or the scheduler is dead", body = ErrorBody),
))]
pub async fn tokenizer_info(State(s): AppState) -> Json<TokenizerInfo> {
    let t = &s.model.tokenizer;
    let text = |id: Option<u32>| id.and_then(|i| t.token_text(i));
    Json(TokenizerInfo {
        model: s.cfg.model_id.clone(),
        vocab_size: t.vocab_size(),
        bos_token_id: t.bos_id,
        eos_token_id: t.eos_id,
        bos_token: text(t.bos_id),
        eos_token: text(t.eos_id),
        max_model_len: s.model.max_positions(),
        has_chat_template: s.model.chat.is_some(),
    })
}
