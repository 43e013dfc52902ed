//! Request handlers: parse, resolve the cloud prompt, queue the private part, answer.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use edgeprompt_engine::{Message, PrefixKv, SamplingParams};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::access::RequestId;
use super::openai::{self, ChatRequest, CompletionRequest, Kind, PromptText, Sampling};
use super::{ApiError, EdgeServer};
use crate::prefixes::LookupError;
use crate::scheduler::{Event, Job, Refusal, STOPPED};

type AppState = State<Arc<EdgeServer>>;

/// Roles whose leading message is the cloud prompt.
const SYSTEM_ROLES: [&str; 2] = ["system", "developer"];

pub async fn chat(
    State(s): AppState,
    Extension(id): Extension<RequestId>,
    body: Bytes,
) -> Response {
    let r = chat_inner(&s, &id, &body).await;
    finish(&s, Kind::Chat, r)
}

pub async fn completions(
    State(s): AppState,
    Extension(id): Extension<RequestId>,
    body: Bytes,
) -> Response {
    let r = completions_inner(&s, &id, &body).await;
    finish(&s, Kind::Completion, r)
}

fn finish(s: &EdgeServer, kind: Kind, r: Result<Response, ApiError>) -> Response {
    let resp = r.unwrap_or_else(|e| e.into_response());
    s.metrics.request(kind.endpoint(), resp.status().as_str());
    resp
}

pub async fn models(State(s): AppState) -> Response {
    s.metrics.request("/v1/models", "200");
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.cfg.model_id,
            "object": "model",
            "created": 0,
            "owned_by": "edgeprompt",
            // Longest prompt + answer a request may use, under the names clients read.
            "context_length": s.model.max_positions(),
            "max_model_len": s.model.max_positions(),
        }],
    }))
    .into_response()
}

pub async fn health(State(s): AppState) -> Response {
    let u = s.scheduler.usage();
    Json(json!({
        "status": if s.is_draining() { "draining" } else { "ok" },
        "pending_requests": s.scheduler.pending(),
        "model": s.cfg.model_id,
        "fingerprint": s.model.fingerprint,
        "active_sequences": u.sequences,
    }))
    .into_response()
}

pub async fn metrics(State(s): AppState) -> Response {
    let m = &s.metrics;
    m.kv_reserved_bytes.set(s.scheduler.reserved_bytes() as i64);
    m.prefix_cache_bytes.set(s.prefixes.memory_bytes() as i64);
    m.resident_memory_bytes
        .set(edgeprompt_engine::machine::rss().unwrap_or(0) as i64);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

fn parse<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

async fn chat_inner(s: &EdgeServer, id: &RequestId, body: &[u8]) -> Result<Response, ApiError> {
    let req: ChatRequest = parse(body)?;
    check_model(s, &req.common)?;
    let chat = s
        .model
        .chat
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("this model has no chat template"))?;
    if req.messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty"));
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    for m in req.messages {
        let content = match m.content {
            Some(c) => c.text().map_err(ApiError::bad_request)?,
            None => String::new(),
        };
        messages.push(Message::new(&m.role, &content));
    }
    let system = match messages.first() {
        Some(m) if SYSTEM_ROLES.contains(&m.role.as_str()) => Some(messages.remove(0).content),
        _ => None,
    };
    let tmpl = |e: edgeprompt_engine::EngineError| ApiError::bad_request(e.to_string());
    let system_ids = match &system {
        Some(sys) => Some(encode(
            s,
            &chat
                .render(&[Message::new("system", sys)], false)
                .map_err(tmpl)?,
        )?),
        None => None,
    };
    let prefix = match (&req.common.cloud_prompt, &system_ids) {
        (Some(id), ids) => {
            let p = s.prefixes.for_id(id).await.map_err(lookup_error)?.prefix;
            if ids.as_ref().is_some_and(|ids| *ids != p.token_ids) {
                return Err(ApiError::bad_request(format!(
                    "the system message is not the text of cloud prompt {id:?}; send one or the other"
                )));
            }
            Some(p)
        }
        (None, Some(ids)) => Some(
            s.prefixes
                .for_system(ids)
                .await
                .map_err(lookup_error)?
                .prefix,
        ),
        (None, None) => None,
    };
    let private_text = match &prefix {
        // The split only needs the system turn's place in the template, not its words.
        Some(_) => {
            chat.split(system.as_deref().unwrap_or("-"), &messages)
                .map_err(tmpl)?
                .edge
        }
        None => chat.render(&messages, true).map_err(tmpl)?,
    };
    let prompt = encode(s, &private_text)?;
    run(s, Kind::Chat, id, req.common, prefix, prompt).await
}

async fn completions_inner(
    s: &EdgeServer,
    id: &RequestId,
    body: &[u8],
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse(body)?;
    check_model(s, &req.common)?;
    let text = match req.prompt {
        PromptText::One(t) => t,
        PromptText::Batch(mut v) if v.len() == 1 => v.remove(0),
        PromptText::Batch(_) => return Err(ApiError::bad_request("send one prompt per request")),
    };
    let prefix = match &req.common.cloud_prompt {
        Some(id) => Some(s.prefixes.for_id(id).await.map_err(lookup_error)?.prefix),
        None => None,
    };
    let prompt = encode(s, &text)?;
    run(s, Kind::Completion, id, req.common, prefix, prompt).await
}

fn check_model(s: &EdgeServer, r: &Sampling) -> Result<(), ApiError> {
    if r.model != s.cfg.model_id {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "the model {:?} does not exist; this server serves {:?}",
                r.model, s.cfg.model_id
            ),
        ));
    }
    if r.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("only n = 1 is supported"));
    }
    if r.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
        return Err(ApiError::bad_request("temperature must be in [0, 2]"));
    }
    if r.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
        return Err(ApiError::bad_request("top_p must be in (0, 1]"));
    }
    Ok(())
}

fn encode(s: &EdgeServer, text: &str) -> Result<Vec<u32>, ApiError> {
    s.model
        .tokenizer
        .encode(text)
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

fn lookup_error(e: LookupError) -> ApiError {
    match e {
        LookupError::UnknownSystem => ApiError::bad_request(e.to_string()),
        LookupError::UnknownId(_) => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
        LookupError::Disk(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        LookupError::Failed(m) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("could not get the cloud prompt: {m}"),
        ),
    }
}

/// Queue the job and answer, streamed or whole.
async fn run(
    s: &EdgeServer,
    kind: Kind,
    request: &RequestId,
    r: Sampling,
    prefix: Option<Arc<PrefixKv>>,
    prompt: Vec<u32>,
) -> Result<Response, ApiError> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let seed = r.seed.unwrap_or_else(rand::random);
    let job = Job {
        prefix,
        prompt,
        max_tokens: r
            .max_completion_tokens
            .or(r.max_tokens)
            .unwrap_or(s.cfg.default_max_tokens),
        sampling: SamplingParams {
            temperature: r.temperature.unwrap_or(1.0),
            top_k: r.top_k.unwrap_or(0),
            top_p: r.top_p.unwrap_or(1.0),
            seed,
        },
        stop: r.stop.map(|s| s.into_vec()).unwrap_or_default(),
        events: tx,
    };
    s.scheduler.submit(job).map_err(|e| match e {
        Refusal::Invalid(m) => ApiError::bad_request(m),
        Refusal::Full {
            retry_after_secs,
            reason,
        } => ApiError {
            retry_after: Some(retry_after_secs),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, reason)
        },
        Refusal::Stopped => ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "this edge is shutting down; retry on another",
            )
        },
    })?;
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Named after its request, so a client's id finds it in the logs; the random tail keeps
    // ids unique when clients reuse theirs.
    let id = format!(
        "{}-{}-{:08x}",
        kind.id_prefix(),
        request.0,
        rand::random::<u32>()
    );
    let model = s.cfg.model_id.clone();
    if r.stream {
        let usage = r.stream_options.is_some_and(|o| o.include_usage);
        return Ok(stream(kind, id, created, model, usage, rx));
    }
    let mut text = String::new();
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done(d)) => {
                return Ok(
                    Json(openai::response(kind, &id, created, &model, &text, &d)).into_response(),
                )
            }
            Some(Event::Failed(m)) => return Err(failure(m)),
            None => return Err(failure("the scheduler dropped the request".into())),
        }
    }
}

fn failure(m: String) -> ApiError {
    let status = if m.contains("timed out") {
        StatusCode::GATEWAY_TIMEOUT
    } else if m == STOPPED {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    ApiError::new(status, m)
}

/// Server-sent events. A client that goes away closes `out`; the forwarder then drops `rx`,
/// which the scheduler sees at its next step and cancels the request.
fn stream(
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    mut rx: mpsc::UnboundedReceiver<Event>,
) -> Response {
    let (out, events) = mpsc::channel::<Result<SseEvent, Infallible>>(32);
    tokio::spawn(async move {
        let data = |v: serde_json::Value| Ok(SseEvent::default().data(v.to_string()));
        let chunk = |text: Option<&str>, role: bool, finish: Option<&str>| {
            data(openai::chunk(
                kind, &id, created, &model, text, role, finish,
            ))
        };
        if kind == Kind::Chat && out.send(chunk(Some(""), true, None)).await.is_err() {
            return;
        }
        loop {
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                _ = out.closed() => return,
            };
            let msg = match ev {
                Some(Event::Text(t)) => chunk(Some(&t), false, None),
                Some(Event::Done(d)) => {
                    let _ = out.send(chunk(None, false, Some(d.finish_reason))).await;
                    if include_usage {
                        let _ = out
                            .send(data(openai::usage_chunk(kind, &id, created, &model, &d)))
                            .await;
                    }
                    break;
                }
                Some(Event::Failed(m)) => {
                    let _ = out.send(data(openai::error_body(500, &m, None))).await;
                    break;
                }
                None => break,
            };
            if out.send(msg).await.is_err() {
                return;
            }
        }
        let _ = out.send(Ok(SseEvent::default().data("[DONE]"))).await;
    });
    Sse::new(ReceiverStream::new(events))
        .keep_alive(KeepAlive::default())
        .into_response()
}
