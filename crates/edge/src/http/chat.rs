//! `POST /v1/chat/completions`: the leading system message is the cloud prompt (by content
//! address, or named by `cloud_prompt`); the other messages are rendered, tokenized and run
//! here, after the conversation's earlier turns when this caller's cache holds them.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use edgeprompt_engine::Message;

use super::access::{Caller, RequestId};
use super::answer::{self, Prepared};
use super::conn::ClientAddr;
use super::error::ApiError;
use super::origin::Origin;
use super::response::Kind;
use super::validation::{self, encode, template_error};
use super::EdgeServer;
use crate::private_cache::Scope;
use crate::scheduler::Keep;

/// Answers a chat; `stream: true` sends `chat.completion.chunk` events, then `[DONE]`.
#[utoipa::path(post, path = "/v1/chat/completions", request_body = super::request::ChatRequest,
    responses(
        (status = 200, description = "The answer; with `stream: true`, server-sent events \
            whose data is a `ChatCompletionChunk`, an `ErrorBody` that ends the stream, or `[DONE]`", content(
            (super::response::ChatCompletion = "application/json"),
            (String = "text/event-stream"))),
        ApiError,
    ))]
pub async fn chat(
    State(s): State<Arc<EdgeServer>>,
    Extension(id): Extension<RequestId>,
    caller: Option<Extension<Caller>>,
    client: Option<Extension<ClientAddr>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let caller = caller.map(|Extension(c)| c.0);
    let client = client.map(|Extension(c)| c.0);
    let r = async {
        let body = validation::body_of(body)?;
        let p = prepare(&s, caller, &body).await?;
        answer::run(&s, (&id, client), p).await
    }
    .await;
    answer::finish(&s, Kind::Chat, r)
}

/// The request checked, its cloud prompt looked up, its private part tokenized (after the
/// turns this caller's cache holds) and its grammar compiled.
async fn prepare(
    s: &Arc<EdgeServer>,
    caller: Option<[u8; 32]>,
    body: &[u8],
) -> Result<Prepared, ApiError> {
    let arrived = Instant::now();
    // A large body is parsed and tokenized two at a time (its memory given back after).
    let gate = s.gate(body.len()).await?;
    let req = validation::chat(&s.model, &s.cfg.model_id, body)?;
    let tools = req.tools.rendered.as_ref();
    let system_ids = match &req.system {
        Some(sys) => Some(encode(
            &s.model,
            &req.template
                .render_tools(&[Message::new("system", sys)], false, tools)
                .map_err(template_error)?,
        )?),
        None => None,
    };
    // Whose the request is: an API key's and a salt's. A private system message's KV is kept
    // for that scope only (callers with neither are one scope: nothing tells them apart).
    let scope = Scope::new(caller.as_ref(), req.cache_salt.as_deref());
    let named = caller.is_some() || req.cache_salt.is_some();
    let cloud_prompt = req.params.sampling.cloud_prompt.as_ref();
    let prefix = match (cloud_prompt, &system_ids) {
        (Some(id), ids) => {
            let p = s.prefixes.for_id_streaming(id).await?;
            if ids.as_ref().is_some_and(|ids| ids != p.kv.token_ids()) {
                return Err(ApiError::bad_request(format!(
                    "the system message is not the text of cloud prompt {id:?}; send one or the other"
                )));
            }
            Some(p)
        }
        (None, Some(ids)) => Some(s.prefixes.for_tenant_streaming(ids, &scope).await?),
        (None, None) => None,
    };
    let private_text = match &prefix {
        // The split only needs the system turn's place in the template, not its words.
        Some(_) => {
            let system = req.system.as_deref().unwrap_or("-");
            req.template
                .split_tools(system, &req.messages, tools)
                .map_err(template_error)?
                .edge
        }
        None => req
            .template
            .render_tools(&req.messages, true, tools)
            .map_err(template_error)?,
    };
    let prompt = encode(&s.model, &private_text)?;
    // The conversation's earlier turns, if this caller's cache holds them: only the rest runs.
    // Only for a caller with a name (an API key or a salt: on an open API callers without one
    // are indistinguishable), and only over exact cloud KV (the bits a turn without the cache
    // would attend to).
    let caching = s.private.is_on() && named && s.prefixes.exact();
    let cloud_len = prefix.as_ref().map_or(0, |p| p.kv.token_ids().len());
    let mut held = None;
    let prompt = match caching.then(|| {
        let mut all = prefix
            .as_ref()
            .map_or_else(Vec::new, |p| p.kv.token_ids().to_vec());
        all.extend_from_slice(&prompt);
        s.private.get(&scope, &all, cloud_len).map(|hit| (hit, all))
    }) {
        Some(Some((hit, all))) => {
            let n = hit.n_tokens();
            held = Some((hit, n - cloud_len));
            all[n..].to_vec()
        }
        _ => prompt,
    };
    let keep: Option<Keep> = caching.then(|| {
        let cache = s.private.clone();
        Box::new(move |kv| cache.put(scope, kv)) as Keep
    });
    let constraint = match req.grammar {
        Some(spec) => Some(s.constraint(spec).await?),
        None => None,
    };
    let mut origin = Origin::new(arrived, prefix, req.params.sampling.cloud_prompt.as_ref());
    if let Some((hit, private)) = held {
        origin.hold(hit, private);
    }
    drop(gate);
    Ok(Prepared {
        kind: Kind::Chat,
        params: req.params,
        origin,
        prompt,
        echo: None,
        constraint,
        tool_calls: req.tools.parse,
        keep,
    })
}
