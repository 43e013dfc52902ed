//! Request handlers: parse, resolve the cloud prompt, queue the private part, answer.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use edgeprompt_engine::{Message, Model, SamplingParams, Spec};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::access::{Caller, RequestId};
use super::conn::ClientAddr;
use super::openai::{self, ChatRequest, CompletionRequest, Kind, PromptText, Sampling};
use super::origin::Origin;
use super::{tools, ApiError, EdgeServer};
use crate::layer_stream::PromptKv;
use crate::prefixes::LookupError;
use crate::private_cache::Scope;
use crate::scheduler::{
    Done, Event, Extras, Job, Keep, Refusal, BUSY, DEAD, NO_CLOUD_PROMPT, STOPPED,
};

type AppState = State<Arc<EdgeServer>>;

/// Roles whose leading message is the cloud prompt.
const SYSTEM_ROLES: [&str; 2] = ["system", "developer"];

pub async fn chat(
    State(s): AppState,
    Extension(id): Extension<RequestId>,
    caller: Option<Extension<Caller>>,
    client: Option<Extension<ClientAddr>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let caller = caller.map(|Extension(c)| c.0);
    let client = client.map(|Extension(c)| c.0);
    let r = match body_of(body) {
        Ok(body) => chat_inner(&s, &id, caller, client, &body).await,
        Err(e) => Err(e),
    };
    finish(&s, Kind::Chat, r)
}

pub async fn completions(
    State(s): AppState,
    Extension(id): Extension<RequestId>,
    client: Option<Extension<ClientAddr>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let client = client.map(|Extension(c)| c.0);
    let r = match body_of(body) {
        Ok(body) => completions_inner(&s, &id, client, &body).await,
        Err(e) => Err(e),
    };
    finish(&s, Kind::Completion, r)
}

/// A body the server would not read (over its endpoint's limit, or broken) as an API error.
pub fn body_of(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        let status = e.status();
        let message = match status {
            StatusCode::PAYLOAD_TOO_LARGE => {
                "the request body is larger than this endpoint takes (more than the model's context could hold)".to_string()
            }
            _ => e.body_text(),
        };
        ApiError::new(status, message)
    })
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

/// `GET /v1/cloud_prompts`: the ids a request may name as `cloud_prompt`.
pub async fn cloud_prompts(State(s): AppState) -> Response {
    let (data, cloud) = s.prefixes.named().await;
    s.metrics.request("/v1/cloud_prompts", "200");
    let state = match (&cloud, s.prefixes.has_cloud()) {
        (_, false) => "none",
        (Ok(()), true) => "reachable",
        (Err(_), true) => "unreachable",
    };
    Json(json!({
        "object": "list",
        "data": data,
        "cloud": state,
        "cloud_error": cloud.err(),
    }))
    .into_response()
}

/// `GET /health`: 200 while the edge can serve (draining or not); 503 with the reason once its
/// scheduler is dead, so an orchestrator restarts it.
pub async fn health(State(s): AppState) -> Response {
    let u = s.scheduler.usage();
    let dead = s.scheduler.dead();
    let conflict = s.prefixes.trust_conflict();
    let status = match (&dead, &conflict, s.is_draining()) {
        (Some(_), _, _) => "dead",
        (None, Some(_), _) => "key_conflict",
        (None, None, true) => "draining",
        (None, None, false) => "ok",
    };
    let mut body = json!({
        "status": status,
        "pending_requests": s.scheduler.pending(),
        "model": s.cfg.model_id,
        "fingerprint": s.model.fingerprint,
        "active_sequences": u.sequences,
    });
    // A key conflict: the edge still answers (computing prompts here) but an operator must
    // settle which key is the cloud's.
    let code = match dead.or(conflict) {
        Some(why) => {
            body["reason"] = why.into();
            StatusCode::SERVICE_UNAVAILABLE
        }
        None => StatusCode::OK,
    };
    (code, Json(body)).into_response()
}

pub async fn metrics(State(s): AppState) -> Response {
    let m = &s.metrics;
    m.kv_reserved_bytes.set(s.scheduler.reserved_bytes() as i64);
    let (cached, held) = s.prefixes.memory_bytes();
    m.prefix_cache_bytes.set(cached as i64);
    m.prefix_cache_held_bytes.set(held as i64);
    m.private_cache_bytes.set(s.private.bytes() as i64);
    m.trust_conflict
        .set(s.prefixes.trust_conflict().is_some() as i64);
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

pub(super) fn parse<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

async fn chat_inner(
    s: &Arc<EdgeServer>,
    id: &RequestId,
    caller: Option<[u8; 32]>,
    client: Option<IpAddr>,
    body: &[u8],
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    // A large body is parsed and tokenized two at a time (its memory given back after).
    let gate = s.gate(body.len()).await?;
    let mut req: ChatRequest = parse(body)?;
    let chat = chat_checks(&s.model, &s.cfg.model_id, &req)?;
    let format = format_spec(&req.common)?;
    let plan = tool_plan(chat, &req, format.is_some())?;
    let tools = plan.rendered.as_ref();
    let (system, messages) = chat_messages(std::mem::take(&mut req.messages))?;
    let tmpl = |e: edgeprompt_engine::EngineError| ApiError::bad_request(e.to_string());
    let system_ids = match &system {
        Some(sys) => Some(encode(
            s,
            &chat
                .render_tools(&[Message::new("system", sys)], false, tools)
                .map_err(tmpl)?,
        )?),
        None => None,
    };
    if tools.is_some() && req.common.cloud_prompt.is_some() {
        return Err(ApiError::bad_request(
            "the chat template writes tools into the system turn, which a cloud prompt fixes; \
             send the system message as text with tools, or no tools",
        ));
    }
    if req
        .cache_salt
        .as_ref()
        .is_some_and(|c| c.chars().count() > 256)
    {
        return Err(ApiError {
            param: Some("cache_salt"),
            ..ApiError::bad_request("cache_salt is over 256 characters")
        });
    }
    // Whose the request is: an API key's and a salt's. A private system message's KV is kept
    // for that scope only (callers with neither are one scope: nothing tells them apart).
    let scope = Scope::new(caller.as_ref(), req.cache_salt.as_deref());
    let named = caller.is_some() || req.cache_salt.is_some();
    let prefix = match (&req.common.cloud_prompt, &system_ids) {
        (Some(id), ids) => {
            let p = s
                .prefixes
                .for_id_streaming(id)
                .await
                .map_err(lookup_error)?;
            if ids.as_ref().is_some_and(|ids| ids != p.kv.token_ids()) {
                return Err(ApiError::bad_request(format!(
                    "the system message is not the text of cloud prompt {id:?}; send one or the other"
                )));
            }
            Some(p)
        }
        (None, Some(ids)) => Some(
            s.prefixes
                .for_tenant_streaming(ids, &scope)
                .await
                .map_err(lookup_error)?,
        ),
        (None, None) => None,
    };
    let private_text = match &prefix {
        // The split only needs the system turn's place in the template, not its words.
        Some(_) => {
            chat.split_tools(system.as_deref().unwrap_or("-"), &messages, tools)
                .map_err(tmpl)?
                .edge
        }
        None => chat.render_tools(&messages, true, tools).map_err(tmpl)?,
    };
    let prompt = encode(s, &private_text)?;
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
    let spec = plan.grammar.or(format);
    let constraint = match spec {
        Some(spec) => Some(s.constraint(spec).await?),
        None => None,
    };
    let shape = Shape {
        constraint,
        tool_calls: plan.parse,
    };
    let mut origin = Origin::new(arrived, prefix, req.common.cloud_prompt.as_ref());
    if let Some((hit, private)) = held {
        origin.hold(hit, private);
    }
    drop(gate);
    run(
        s,
        Kind::Chat,
        (id, client),
        req.common,
        origin,
        prompt,
        None,
        shape,
        keep,
    )
    .await
}

/// What the answer is held to: a grammar, and whether calls are read out of it.
struct Shape {
    constraint: Option<edgeprompt_engine::Constraint>,
    tool_calls: Option<Vec<String>>,
}

/// The request's tools, checked against the template.
fn tool_plan(
    chat: &edgeprompt_engine::ChatTemplate,
    req: &ChatRequest,
    formatted: bool,
) -> Result<tools::ToolPlan, ApiError> {
    let bad = |m: String| ApiError {
        param: Some("tools"),
        ..ApiError::bad_request(m)
    };
    let plan = tools::plan(
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls.unwrap_or(true),
    )
    .map_err(bad)?;
    if plan.rendered.is_some() && !chat.tool_calls {
        return Err(bad(
            "this model's chat template does not render tools (Qwen2.5's does)".into(),
        ));
    }
    if plan.grammar.is_some() && formatted {
        return Err(bad(
            "tools cannot be combined with response_format or grammar; set tool_choice \"none\" \
             to constrain the answer instead"
                .into(),
        ));
    }
    Ok(plan)
}

/// Most bytes of a grammar or schema (compiling is bounded by llguidance's own limits too).
const MAX_GRAMMAR_BYTES: usize = 64 << 10;

/// The grammar `response_format` or `grammar` asks for.
fn format_spec(r: &Sampling) -> Result<Option<Spec>, ApiError> {
    let bad = |p: &'static str, m: String| ApiError {
        param: Some(p),
        ..ApiError::bad_request(m)
    };
    let from_format = match &r.response_format {
        None => None,
        Some(f) => match f.kind.as_str() {
            "text" => None,
            "json_object" => Some(Spec::JsonSchema(json!({"type": "object"}))),
            "json_schema" => {
                let schema = f
                    .json_schema
                    .as_ref()
                    .and_then(|j| j.schema.clone())
                    .ok_or_else(|| bad("response_format", "json_schema needs a schema".into()))?;
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(bad(
                        "response_format",
                        "the schema must be a JSON object".into(),
                    ));
                }
                if schema.to_string().len() > MAX_GRAMMAR_BYTES {
                    return Err(bad(
                        "response_format",
                        format!("the schema is over {MAX_GRAMMAR_BYTES} bytes"),
                    ));
                }
                Some(Spec::JsonSchema(schema))
            }
            other => {
                return Err(bad(
                    "response_format",
                    format!(
                    "response_format {other:?}: use \"text\", \"json_object\" or \"json_schema\""
                ),
                ))
            }
        },
    };
    match (&r.grammar, from_format) {
        (Some(_), Some(_)) => Err(bad(
            "grammar",
            "give grammar or response_format, not both".into(),
        )),
        (Some(g), None) if g.len() > MAX_GRAMMAR_BYTES => Err(bad(
            "grammar",
            format!("the grammar is over {MAX_GRAMMAR_BYTES} bytes"),
        )),
        (Some(g), None) => Ok(Some(Spec::Lark(g.clone()))),
        (None, f) => Ok(f),
    }
}

async fn completions_inner(
    s: &Arc<EdgeServer>,
    id: &RequestId,
    client: Option<IpAddr>,
    body: &[u8],
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let gate = s.gate(body.len()).await?;
    let req: CompletionRequest = parse(body)?;
    check_sampling(&s.cfg.model_id, &req.common)?;
    logprobs_asked(Kind::Completion, &req.common)?;
    let one = || ApiError::bad_request("send one prompt per request");
    let (text, ids) = match req.prompt {
        PromptText::One(t) => (t, None),
        PromptText::Batch(mut v) if v.len() == 1 => (v.remove(0), None),
        PromptText::IdBatch(mut v) if v.len() == 1 => prompt_ids(&s.model, v.remove(0))?,
        PromptText::Ids(ids) => prompt_ids(&s.model, ids)?,
        PromptText::Batch(_) | PromptText::IdBatch(_) => return Err(one()),
    };
    let mut prefix = match &req.common.cloud_prompt {
        Some(id) => Some(
            s.prefixes
                .for_id_streaming(id)
                .await
                .map_err(lookup_error)?,
        ),
        None => None,
    };
    // A prompt of its own starts with BOS where the model wants one; after a cloud prompt it
    // continues that prompt's text.
    let mut prompt = match (ids, prefix.is_some()) {
        (Some(ids), _) => ids,
        (None, true) => encode(s, &text)?,
        (None, false) => s
            .model
            .tokenizer
            .encode_prompt(&text)
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
    let echo = (req.common.echo == Some(true)).then(|| openai::Echo {
        text,
        ids: prompt.clone(),
        shared,
    });
    let constraint = match format_spec(&req.common)? {
        Some(spec) => Some(s.constraint(spec).await?),
        None => None,
    };
    let shape = Shape {
        constraint,
        tool_calls: None,
    };
    let origin = Origin::new(arrived, prefix, req.common.cloud_prompt.as_ref());
    drop(gate);
    run(
        s,
        Kind::Completion,
        (id, client),
        req.common,
        origin,
        prompt,
        echo,
        shape,
        None,
    )
    .await
}

/// A prompt given as token ids: its text (for `echo`), and the ids.
fn prompt_ids(model: &Model, ids: Vec<u32>) -> Result<(String, Option<Vec<u32>>), ApiError> {
    Ok((text_of(model, &ids)?, Some(ids)))
}

/// The text of token ids from a client: each must be in the vocabulary.
pub(super) fn text_of(model: &Model, ids: &[u32]) -> Result<String, ApiError> {
    let vocab = model.tokenizer.vocab_size();
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad_request(format!(
            "token id {bad} is past the vocabulary of {vocab}"
        )));
    }
    model
        .tokenizer
        .decode(ids)
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// Most stop sequences a request may give, and most bytes in each (OpenAI's limit is 4; every
/// sampled token scans the answer's tail for each of them).
const MAX_STOPS: usize = 4;
const MAX_STOP_BYTES: usize = 256;

fn check_stop(stop: Option<&openai::Stop>) -> Result<(), ApiError> {
    let stops: &[String] = match stop {
        None => return Ok(()),
        Some(openai::Stop::One(s)) => std::slice::from_ref(s),
        Some(openai::Stop::Many(v)) => v,
    };
    let bad = |m: String| ApiError {
        param: Some("stop"),
        ..ApiError::bad_request(m)
    };
    if stops.len() > MAX_STOPS {
        return Err(bad(format!(
            "stop has {} sequences; at most {MAX_STOPS} are allowed",
            stops.len()
        )));
    }
    for s in stops {
        if s.is_empty() {
            return Err(bad("a stop sequence must not be empty".into()));
        }
        if s.len() > MAX_STOP_BYTES {
            return Err(bad(format!(
                "a stop sequence has {} bytes; at most {MAX_STOP_BYTES} are allowed",
                s.len()
            )));
        }
    }
    Ok(())
}

/// The checks of a chat request before its messages: sampling, log-probabilities, no echo, a
/// chat template, some messages.
fn chat_checks<'m>(
    model: &'m Model,
    model_id: &str,
    req: &ChatRequest,
) -> Result<&'m edgeprompt_engine::ChatTemplate, ApiError> {
    check_sampling(model_id, &req.common)?;
    logprobs_asked(Kind::Chat, &req.common)?;
    if req.common.echo == Some(true) {
        return Err(ApiError::bad_request(
            "echo is a completions option (/v1/completions)",
        ));
    }
    let chat = model.chat.as_ref().ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template: use /v1/completions, or start the server with --chat-template FILE",
        )
    })?;
    if req.messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty"));
    }
    Ok(chat)
}

/// The messages as text, the leading system message (the cloud prompt) apart.
fn chat_messages(
    wire: Vec<openai::ChatMessage>,
) -> Result<(Option<String>, Vec<Message>), ApiError> {
    let mut messages = Vec::with_capacity(wire.len());
    for m in wire {
        let content = match m.content {
            Some(c) => c.text().map_err(ApiError::bad_request)?,
            None => String::new(),
        };
        let mut msg = Message::new(&m.role, &content);
        msg.tool_calls = m.tool_calls.as_deref().map(tools::rendered_calls);
        msg.tool_call_id = m.tool_call_id;
        messages.push(msg);
    }
    let system = match messages.first() {
        Some(m) if SYSTEM_ROLES.contains(&m.role.as_str()) => Some(messages.remove(0).content),
        _ => None,
    };
    Ok((system, messages))
}

/// Everything a request body goes through before its cloud prompt is looked up: parsing, the
/// parameter checks, the chat template (whole and split at the system turn) and the tokenizer.
/// The HTTP fuzz target drives it with arbitrary bytes; an error is a 4xx, never a panic.
#[doc(hidden)]
pub fn check_request(
    model: &Model,
    model_id: &str,
    chat: bool,
    body: &[u8],
) -> Result<usize, String> {
    let err = |e: ApiError| e.message;
    let tokens = |t: &str| model.tokenizer.encode(t).map_err(|e| e.to_string());
    if !chat {
        let req: CompletionRequest = parse(body).map_err(err)?;
        check_sampling(model_id, &req.common).map_err(err)?;
        logprobs_asked(Kind::Completion, &req.common).map_err(err)?;
        return match req.prompt {
            PromptText::One(t) => tokens(&t).map(|t| t.len()),
            PromptText::Batch(v) => Ok(v.iter().map(|t| tokens(t).map_or(0, |t| t.len())).sum()),
            PromptText::Ids(ids) => prompt_ids(model, ids).map(|_| 0).map_err(err),
            PromptText::IdBatch(v) => Ok(v
                .into_iter()
                .filter_map(|ids| prompt_ids(model, ids).ok())
                .count()),
        };
    }
    let mut req: ChatRequest = parse(body).map_err(err)?;
    let template = chat_checks(model, model_id, &req).map_err(err)?;
    let format = format_spec(&req.common).map_err(err)?;
    tool_plan(template, &req, format.is_some()).map_err(err)?;
    let (system, messages) = chat_messages(std::mem::take(&mut req.messages)).map_err(err)?;
    let e = |e: edgeprompt_engine::EngineError| e.to_string();
    let mut n = tokens(&template.render(&messages, true).map_err(e)?)?.len();
    if let Some(sys) = system {
        n += tokens(
            &template
                .render(&[Message::new("system", &sys)], false)
                .map_err(e)?,
        )?
        .len();
        n += tokens(&template.split(&sys, &messages).map_err(e)?.edge)?.len();
    }
    Ok(n)
}

fn check_sampling(model_id: &str, r: &Sampling) -> Result<(), ApiError> {
    if let Some(m) = r.model.as_deref().filter(|m| *m != model_id) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("the model {m:?} does not exist; this server serves {model_id:?}"),
        ));
    }
    if r.n.is_some_and(|n| !(1..=MAX_N).contains(&n)) {
        return Err(ApiError::bad_request(format!(
            "n must be between 1 and {MAX_N}"
        )));
    }
    if r.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
        return Err(ApiError::bad_request("temperature must be in [0, 2]"));
    }
    if r.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
        return Err(ApiError::bad_request("top_p must be in (0, 1]"));
    }
    check_stop(r.stop.as_ref())
}

/// Most answers one request may ask for (`n`).
const MAX_N: usize = 16;
/// Most alternatives per token in `logprobs` (OpenAI's limit).
const MAX_TOP_LOGPROBS: usize = 20;

/// How many alternatives per token the request asks log-probabilities for (`None`: no
/// log-probabilities): chat's `logprobs: true` + `top_logprobs`, completions' `logprobs: k`.
fn logprobs_asked(kind: Kind, r: &Sampling) -> Result<Option<usize>, ApiError> {
    let top = match (kind, &r.logprobs) {
        (_, None | Some(Value::Null)) => return Ok(None),
        (Kind::Chat, Some(Value::Bool(false))) => return Ok(None),
        (Kind::Chat, Some(Value::Bool(true))) => r.top_logprobs.unwrap_or(0),
        (Kind::Completion, Some(v)) if v.as_u64().is_some() => v.as_u64().unwrap_or(0) as usize,
        (Kind::Chat, Some(_)) => {
            return Err(ApiError::bad_request("logprobs must be true or false"))
        }
        (Kind::Completion, Some(_)) => {
            return Err(ApiError::bad_request(
                "logprobs must be a number of alternatives",
            ))
        }
    };
    if top > MAX_TOP_LOGPROBS {
        return Err(ApiError::bad_request(format!(
            "at most {MAX_TOP_LOGPROBS} alternatives per token"
        )));
    }
    Ok(Some(top))
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
        LookupError::Busy(_) => ApiError {
            retry_after: Some(1),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string())
        },
        LookupError::TooLong(_) => ApiError::bad_request(e.to_string()),
        LookupError::Failed(m) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("could not get the cloud prompt: {m}"),
        ),
    }
}

/// Queue the job and answer, streamed or whole; `echo`: the prompt to answer first.
#[allow(clippy::too_many_arguments)]
async fn run(
    s: &EdgeServer,
    kind: Kind,
    (request, client): (&RequestId, Option<IpAddr>),
    r: Sampling,
    mut origin: Origin,
    prompt: Vec<u32>,
    echo: Option<openai::Echo>,
    shape: Shape,
    keep: Option<Keep>,
) -> Result<Response, ApiError> {
    // Kept turns run after their own prefix (the same cloud prompt's KV, whole).
    let (prefix, cold, kept) = match (origin.kept(), origin.kv()) {
        (Some(k), _) => (k.kv.prefix.clone(), None, Some(k.clone())),
        (None, Some(PromptKv::Ready(p))) => (Some(p.clone()), None, None),
        (None, Some(PromptKv::Streaming(s))) => (None, Some(s.clone()), None),
        (None, None) => (None, None, None),
    };
    let private_tokens = prompt.len();
    let logprobs = logprobs_asked(kind, &r)?;
    let n = r.n.unwrap_or(1);
    let (mut txs, mut rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::unbounded_channel()).unzip();
    let tx = txs.remove(0);
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
    let extras = Extras {
        cold,
        logprobs,
        echo: echo.is_some(),
        forks: txs,
        constraint: shape.constraint,
        keep,
        kept,
        client,
    };
    s.scheduler.submit_with(job, extras).map_err(|e| match e {
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
        Refusal::Dead(why) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, why),
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
    let text_of = token_text(s);
    if r.stream {
        let usage = r.stream_options.is_some_and(|o| o.include_usage);
        let meta = StreamMeta {
            kind,
            id,
            created,
            model,
            include_usage: usage,
            echo,
            tool_calls: shape.tool_calls.clone(),
            origin,
            private_tokens,
        };
        return Ok(stream(meta, rxs, text_of));
    }
    let mut answers = Vec::with_capacity(n);
    for rx in &mut rxs {
        answers.push(whole(rx).await?);
    }
    let answers: Vec<(String, &Done)> = answers
        .iter()
        .map(|(text, d)| match &echo {
            Some(e) => (format!("{}{text}", e.text), d),
            None => (text.clone(), d),
        })
        .collect();
    let answers: Vec<openai::Answer> = answers
        .iter()
        .map(|(text, d)| openai::Answer {
            text,
            done: d,
            logprobs: openai::logprobs_json(kind, echo.as_ref(), d, &*text_of),
            tool_calls: shape.tool_calls.as_deref(),
        })
        .collect();
    let mut v = openai::response(kind, &id, created, &model, &answers);
    if let Some(a) = answers.first() {
        v["edgeprompt"] = origin.block(a.done, private_tokens);
    }
    Ok(Json(v).into_response())
}

/// One answer, whole.
async fn whole(rx: &mut mpsc::UnboundedReceiver<Event>) -> Result<(String, Done), ApiError> {
    let mut text = String::new();
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done(d)) => return Ok((text, d)),
            Some(Event::Failed(m)) => return Err(failure(m)),
            None => return Err(failure("the scheduler dropped the request".into())),
        }
    }
}

/// A token id's text, for `logprobs`.
fn token_text(s: &EdgeServer) -> Arc<dyn Fn(u32) -> String + Send + Sync> {
    let model = s.model.clone();
    Arc::new(move |id| model.tokenizer.decode(&[id]).unwrap_or_default())
}

fn failure(m: String) -> ApiError {
    let status = if m.contains("timed out") {
        StatusCode::GATEWAY_TIMEOUT
    } else if m == STOPPED || m.starts_with(DEAD) {
        StatusCode::SERVICE_UNAVAILABLE
    } else if m.starts_with(BUSY) {
        StatusCode::TOO_MANY_REQUESTS
    } else if m.starts_with(NO_CLOUD_PROMPT) {
        StatusCode::BAD_GATEWAY
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    ApiError {
        retry_after: (status == StatusCode::TOO_MANY_REQUESTS).then_some(1),
        ..ApiError::new(status, m)
    }
}

struct StreamMeta {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    echo: Option<openai::Echo>,
    /// Read calls to these functions out of the answers' text.
    tool_calls: Option<Vec<String>>,
    origin: Origin,
    private_tokens: usize,
}

/// One streamed piece of an answer read for tool calls: its text, or a call (the `sent`th).
fn tool_piece(
    m: &StreamMeta,
    index: usize,
    piece: tools::Streamed,
    sent: &mut usize,
) -> Result<SseEvent, Infallible> {
    let v = match piece {
        tools::Streamed::Content(t) => openai::chunk(
            m.kind,
            &m.id,
            m.created,
            &m.model,
            openai::Piece::new(index, Some(&t), false, None, Value::Null),
        ),
        tools::Streamed::Call(c) => {
            *sent += 1;
            openai::tool_call_chunk(&m.id, m.created, &m.model, index, *sent - 1, &c)
        }
    };
    Ok(SseEvent::default().data(v.to_string()))
}

/// Server-sent events, the answers' chunks interleaved by `index`. A client that goes away
/// closes `out`; the forwarder then drops the receivers, which the scheduler sees at its next
/// step and cancels the answers.
fn stream(
    mut m: StreamMeta,
    rxs: Vec<mpsc::UnboundedReceiver<Event>>,
    text_of: Arc<dyn Fn(u32) -> String + Send + Sync>,
) -> Response {
    let (out, events) = mpsc::channel::<Result<SseEvent, Infallible>>(32);
    tokio::spawn(async move {
        let data = |v: serde_json::Value| Ok(SseEvent::default().data(v.to_string()));
        let chunk =
            |p: openai::Piece<'_>| data(openai::chunk(m.kind, &m.id, m.created, &m.model, p));
        let n = rxs.len();
        if m.kind == Kind::Chat {
            for i in 0..n {
                if out
                    .send(chunk(openai::Piece::new(
                        i,
                        Some(""),
                        true,
                        None,
                        Value::Null,
                    )))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
        if let Some(e) = &m.echo {
            for i in 0..n {
                let piece = openai::Piece::new(i, Some(&e.text), false, None, Value::Null);
                if out.send(chunk(piece)).await.is_err() {
                    return;
                }
            }
        }
        let mut merged = tokio_stream::StreamMap::new();
        for (i, rx) in rxs.into_iter().enumerate() {
            merged.insert(i, tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
        }
        let mut done: Vec<Done> = Vec::new();
        let mut calls: Vec<(tools::CallStream, usize)> = (0..n)
            .map(|_| {
                (
                    tools::CallStream::new(m.tool_calls.clone().unwrap_or_default()),
                    0,
                )
            })
            .collect();
        while done.len() < n {
            let next = tokio::select! {
                ev = tokio_stream::StreamExt::next(&mut merged) => ev,
                _ = out.closed() => return,
            };
            let mut msgs = Vec::new();
            let mut stop = false;
            match next {
                Some((i, Event::Text(t))) if m.tool_calls.is_some() => {
                    let (parser, sent) = &mut calls[i];
                    let pieces = parser.push(&t);
                    msgs.extend(pieces.into_iter().map(|p| tool_piece(&m, i, p, sent)));
                }
                Some((i, Event::Text(t))) => msgs.push(chunk(openai::Piece::new(
                    i,
                    Some(&t),
                    false,
                    None,
                    Value::Null,
                ))),
                Some((i, Event::Done(d))) => {
                    let mut reason = d.finish_reason;
                    if m.tool_calls.is_some() {
                        let (parser, sent) = &mut calls[i];
                        let pieces = parser.finish();
                        msgs.extend(pieces.into_iter().map(|p| tool_piece(&m, i, p, sent)));
                        if *sent > 0 && reason == "stop" {
                            reason = "tool_calls";
                        }
                    }
                    let lp = openai::logprobs_json(m.kind, m.echo.as_ref(), &d, &*text_of);
                    let piece = openai::Piece::new(i, None, false, Some(reason), lp);
                    let mut last = openai::chunk(m.kind, &m.id, m.created, &m.model, piece);
                    last["edgeprompt"] = m.origin.block(&d, m.private_tokens);
                    msgs.push(data(last));
                    done.push(d);
                }
                Some((_, Event::Failed(e))) => {
                    // The status the answer would have had, had it not begun already.
                    let status = failure(e.clone()).status.as_u16();
                    let mut body = openai::error_body(status, &e, None);
                    body["error"]["status"] = status.into();
                    msgs.push(data(body));
                    stop = true;
                }
                None => stop = true,
            };
            for msg in msgs {
                if out.send(msg).await.is_err() {
                    return;
                }
            }
            if stop {
                break;
            }
        }
        if m.include_usage && done.len() == n {
            let d: Vec<&Done> = done.iter().collect();
            let _ = out
                .send(data(openai::usage_chunk(
                    m.kind, &m.id, m.created, &m.model, &d,
                )))
                .await;
        }
        let _ = out.send(Ok(SseEvent::default().data("[DONE]"))).await;
    });
    Sse::new(ReceiverStream::new(events))
        .keep_alive(KeepAlive::default())
        .into_response()
}
