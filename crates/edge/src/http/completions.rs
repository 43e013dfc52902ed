//! `POST /v1/completions`: a prompt (text or token ids) run here, after the cloud prompt it
//! names (`cloud_prompt`) or one held here that it begins with.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use axum::Extension;

use super::access::RequestId;
use super::answer::{self, Prepared};
use super::conn::ClientAddr;
use super::error::ApiError;
use super::origin::Origin;
use super::response::{Echo, Kind};
use super::validation::{self, encode};
use super::EdgeServer;

/// Completes a prompt; `stream: true` sends `text_completion` events, then `[DONE]`.
#[utoipa::path(post, path = "/v1/completions", request_body = super::request::CompletionRequest,
    responses(
        (status = 200, description = "The answer; with `stream: true`, server-sent events \
            whose data is a `CompletionChunk`, an `ErrorBody` that ends the stream, or `[DONE]`", content(
            (super::response::Completion = "application/json"),
            (String = "text/event-stream"))),
        ApiError,
    ))]
pub async fn completions(
    State(s): State<Arc<EdgeServer>>,
    Extension(id): Extension<RequestId>,
    client: Option<Extension<ClientAddr>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let client: Option<IpAddr> = client.map(|Extension(c)| c.0);
    let r = async {
        let body = validation::body_of(body)?;
        let p = prepare(&s, &body).await?;
        answer::run(&s, (&id, client), p).await
    }
    .await;
    answer::finish(&s, Kind::Completion, r)
}

/// The request checked, its cloud prompt looked up (named, or held here and begun with), its
/// prompt tokenized and its grammar compiled.
async fn prepare(s: &Arc<EdgeServer>, body: &[u8]) -> Result<Prepared, ApiError> {
    let arrived = Instant::now();
    let gate = s.gate(body.len()).await?;
    let req = validation::completion(&s.model, &s.cfg.model_id, body)?;
    let cloud_prompt = req.params.sampling.cloud_prompt.as_ref();
    let mut prefix = match cloud_prompt {
        Some(id) => Some(s.prefixes.for_id_streaming(id).await?),
        None => None,
    };
    // A prompt of its own starts with BOS where the model wants one; after a cloud prompt it
    // continues that prompt's text.
    let mut prompt = match (req.ids, prefix.is_some()) {
        (Some(ids), _) => ids,
        (None, true) => encode(&s.model, &req.text)?,
        (None, false) => s
            .model
            .tokenizer
            .encode_prompt(&req.text)
            .map_err(|e| ApiError::bad_request(e.to_string()))?,
    };
    if prompt.is_empty() && prefix.is_none() {
        return Err(ApiError::bad_request("the prompt has no tokens"));
    }
    // A prompt sent whole that begins with a cloud prompt held here runs on its KV.
    let mut shared = Vec::new();
    if prefix.is_none() {
        if let Some(l) = s.prefixes.held_prefix_of(&prompt) {
            shared = prompt.drain(..l.kv.token_ids().len()).collect();
            prefix = Some(l);
        }
    }
    // Echo answers the prompt as sent (after a cloud prompt: this request's part of it).
    let echo = (req.params.sampling.echo == Some(true)).then(|| Echo {
        text: req.text,
        ids: prompt.clone(),
        shared,
    });
    let constraint = match req.grammar {
        Some(spec) => Some(s.constraint(spec).await?),
        None => None,
    };
    let origin = Origin::new(arrived, prefix, req.params.sampling.cloud_prompt.as_ref());
    drop(gate);
    Ok(Prepared {
        kind: Kind::Completion,
        params: req.params,
        origin,
        prompt,
        echo,
        constraint,
        tool_calls: None,
        keep: None,
    })
}
