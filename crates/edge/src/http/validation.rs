//! Every check of a request body, in one place: a body becomes a validated request (or a 4xx
//! naming what is wrong) before any work is done for it. Nothing here looks anything up or
//! queues anything; the flows (`chat.rs`, `completions.rs`) take what comes out.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use edgeprompt_engine::{ChatTemplate, EngineError, Message, Model, Spec};
use serde_json::{json, Value};

use super::error::ApiError;
use super::request::{
    ChatMessage, ChatRequest, CompletionRequest, PromptText, Sampling, Stop, Tool, ToolChoice,
};
use super::response::Kind;
use super::tools::{self, ToolPlan};

/// Roles whose leading message is the cloud prompt.
const SYSTEM_ROLES: [&str; 2] = ["system", "developer"];

/// Most answers one request may ask for (`n`).
const MAX_N: usize = 16;

/// Most alternatives per token in `logprobs` (OpenAI's limit).
const MAX_TOP_LOGPROBS: usize = 20;

/// Most stop sequences a request may give, and most bytes in each (OpenAI's limit is 4; every
/// sampled token scans the answer's tail for each of them).
const MAX_STOPS: usize = 4;
const MAX_STOP_BYTES: usize = 256;

/// Most bytes of a grammar or schema (compiling is bounded by llguidance's own limits too).
const MAX_GRAMMAR_BYTES: usize = 64 << 10;

/// Most characters of a `cache_salt`.
const MAX_CACHE_SALT: usize = 256;

/// A chat request that passed every check.
pub struct ValidChat<'m> {
    pub template: &'m ChatTemplate,
    /// The leading system message: the cloud prompt's text, if any.
    pub system: Option<String>,
    /// The other messages: the private prompt.
    pub messages: Vec<Message>,
    pub tools: ToolPlan,
    /// The grammar the answer is held to (the tools' or the requested format's).
    pub grammar: Option<Spec>,
    pub cache_salt: Option<String>,
    pub params: Params,
}

/// A completion request that passed every check.
pub struct ValidCompletion {
    /// The prompt's text (for `echo`), and its ids when the client sent ids.
    pub text: String,
    pub ids: Option<Vec<u32>>,
    pub grammar: Option<Spec>,
    pub params: Params,
}

/// The sampling and answer parameters, checked.
pub struct Params {
    pub sampling: Sampling,
    /// Alternatives per token to return log-probabilities for (`None`: no log-probabilities).
    pub logprobs: Option<usize>,
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

pub fn parse<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

pub fn chat<'m>(model: &'m Model, model_id: &str, body: &[u8]) -> Result<ValidChat<'m>, ApiError> {
    let mut req: ChatRequest = parse(body)?;
    let params = params(model_id, Kind::Chat, req.common)?;
    if params.sampling.echo == Some(true) {
        return Err(ApiError::bad_request(
            "echo is a completions option (/v1/completions)",
        ));
    }
    let template = model.chat.as_ref().ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template: use /v1/completions, or start the server with --chat-template FILE",
        )
    })?;
    if req.messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty"));
    }
    let format = format_spec(&params.sampling)?;
    let mut tools = tool_plan(
        template,
        (req.tools.as_deref(), req.tool_choice.as_ref()),
        req.parallel_tool_calls,
        format.is_some(),
    )?;
    let (system, messages) = chat_messages(std::mem::take(&mut req.messages))?;
    if tools.rendered.is_some() && params.sampling.cloud_prompt.is_some() {
        return Err(ApiError::bad_request(
            "the chat template writes tools into the system turn, which a cloud prompt fixes; \
             send the system message as text with tools, or no tools",
        ));
    }
    if req
        .cache_salt
        .as_ref()
        .is_some_and(|c| c.chars().count() > MAX_CACHE_SALT)
    {
        return Err(ApiError::bad_param(
            "cache_salt",
            format!("cache_salt is over {MAX_CACHE_SALT} characters"),
        ));
    }
    Ok(ValidChat {
        template,
        system,
        messages,
        grammar: tools.grammar.take().or(format),
        tools,
        cache_salt: req.cache_salt,
        params,
    })
}

pub fn completion(model: &Model, model_id: &str, body: &[u8]) -> Result<ValidCompletion, ApiError> {
    let req: CompletionRequest = parse(body)?;
    let params = params(model_id, Kind::Completion, req.common)?;
    let one = || ApiError::bad_request("send one prompt per request");
    let (text, ids) = match req.prompt {
        PromptText::One(t) => (t, None),
        PromptText::Batch(mut v) if v.len() == 1 => (v.remove(0), None),
        PromptText::IdBatch(mut v) if v.len() == 1 => prompt_ids(model, v.remove(0))?,
        PromptText::Ids(ids) => prompt_ids(model, ids)?,
        PromptText::Batch(_) | PromptText::IdBatch(_) => return Err(one()),
    };
    Ok(ValidCompletion {
        text,
        ids,
        grammar: format_spec(&params.sampling)?,
        params,
    })
}

/// The checks both endpoints share: the model, `n`, temperature, top-p, stops, logprobs.
fn params(model_id: &str, kind: Kind, r: Sampling) -> Result<Params, ApiError> {
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
    check_stop(r.stop.as_ref())?;
    Ok(Params {
        logprobs: logprobs_asked(kind, &r)?,
        sampling: r,
    })
}

fn check_stop(stop: Option<&Stop>) -> Result<(), ApiError> {
    let stops: &[String] = match stop {
        None => return Ok(()),
        Some(Stop::One(s)) => std::slice::from_ref(s),
        Some(Stop::Many(v)) => v,
    };
    let bad = |m: String| ApiError::bad_param("stop", m);
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

/// The request's tools, checked against the template.
fn tool_plan(
    template: &ChatTemplate,
    (given, choice): (Option<&[Tool]>, Option<&ToolChoice>),
    parallel: Option<bool>,
    formatted: bool,
) -> Result<ToolPlan, ApiError> {
    let bad = |m: String| ApiError::bad_param("tools", m);
    let plan = tools::plan(given, choice, parallel.unwrap_or(true)).map_err(bad)?;
    if plan.rendered.is_some() && !template.tool_calls {
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

/// The grammar `response_format` or `grammar` asks for.
fn format_spec(r: &Sampling) -> Result<Option<Spec>, ApiError> {
    let bad = |p: &'static str, m: String| ApiError::bad_param(p, m);
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

/// The messages as text, the leading system message (the cloud prompt) apart.
fn chat_messages(wire: Vec<ChatMessage>) -> Result<(Option<String>, Vec<Message>), ApiError> {
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

/// A prompt given as token ids: its text (for `echo`), and the ids.
fn prompt_ids(model: &Model, ids: Vec<u32>) -> Result<(String, Option<Vec<u32>>), ApiError> {
    Ok((text_of(model, &ids)?, Some(ids)))
}

/// The text of token ids from a client: each must be in the vocabulary.
pub fn text_of(model: &Model, ids: &[u32]) -> Result<String, ApiError> {
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

/// Text as token ids (no BOS), or a 400.
pub fn encode(model: &Model, text: &str) -> Result<Vec<u32>, ApiError> {
    model
        .tokenizer
        .encode(text)
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// A chat template's error as a 400.
pub fn template_error(e: EngineError) -> ApiError {
    ApiError::bad_request(e.to_string())
}

/// Everything a request body goes through before its cloud prompt is looked up: parsing, the
/// parameter checks, the chat template (whole and split at the system turn) and the tokenizer.
/// The HTTP fuzz target drives it with arbitrary bytes; an error is a 4xx, never a panic.
#[doc(hidden)]
pub fn check_request(
    model: &Model,
    model_id: &str,
    is_chat: bool,
    body: &[u8],
) -> Result<usize, String> {
    let err = |e: ApiError| e.message;
    let tokens = |t: &str| model.tokenizer.encode(t).map_err(|e| e.to_string());
    if !is_chat {
        // Every prompt of a batch is tokenized or checked, though a request runs one.
        let req: CompletionRequest = parse(body).map_err(err)?;
        let params = params(model_id, Kind::Completion, req.common).map_err(err)?;
        format_spec(&params.sampling).map_err(err)?;
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
    let v = chat(model, model_id, body).map_err(err)?;
    let e = |e: EngineError| e.to_string();
    let mut n = tokens(&v.template.render(&v.messages, true).map_err(e)?)?.len();
    if let Some(sys) = v.system {
        n += tokens(
            &v.template
                .render(&[Message::new("system", &sys)], false)
                .map_err(e)?,
        )?
        .len();
        n += tokens(&v.template.split(&sys, &v.messages).map_err(e)?.edge)?.len();
    }
    Ok(n)
}
