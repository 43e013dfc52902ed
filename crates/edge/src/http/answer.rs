//! A prepared request queued and answered: whole (one JSON body) or streamed (`stream.rs`).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::response::{IntoResponse, Response};
use axum::Json;
use edgeprompt_engine::{Constraint, SamplingParams};
use tokio::sync::mpsc;

use super::access::RequestId;
use super::error::ApiError;
use super::origin::Origin;
use super::response::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatLogprobs, Completion, CompletionChoice,
    CompletionLogprobs, Echo, Kind, Scored, Usage,
};
use super::stream::{self, StreamMeta};
use super::tools;
use super::validation::Params;
use super::EdgeServer;
use crate::layer_stream::PromptKv;
use crate::scheduler::{Done, Event, Extras, Failure, Job, Keep};

/// A request ready to queue: its private prompt, where its cloud prompt came from, and what
/// its answer is held to.
pub struct Prepared {
    pub kind: Kind,
    pub params: Params,
    pub origin: Origin,
    pub prompt: Vec<u32>,
    /// The prompt to answer first (completions' `echo`).
    pub echo: Option<Echo>,
    pub constraint: Option<Constraint>,
    /// Read calls to these functions out of the answers.
    pub tool_calls: Option<Vec<String>>,
    /// Where the conversation's KV goes when the first answer ends well.
    pub keep: Option<Keep>,
}

/// The response, counted under its endpoint and status.
pub fn finish(s: &EdgeServer, kind: Kind, r: Result<Response, ApiError>) -> Response {
    let resp = r.unwrap_or_else(|e| e.into_response());
    s.metrics.request(kind.endpoint(), resp.status().as_str());
    resp
}

/// Queue the job and answer, streamed or whole.
pub async fn run(
    s: &EdgeServer,
    (request, client): (&RequestId, Option<IpAddr>),
    p: Prepared,
) -> Result<Response, ApiError> {
    let Prepared {
        kind,
        params: Params {
            sampling: r,
            logprobs,
        },
        origin,
        prompt,
        echo,
        constraint,
        tool_calls,
        keep,
    } = p;
    // Kept turns run after their own prefix (the same cloud prompt's KV, whole).
    let (prefix, cold, kept) = match (origin.kept(), origin.kv()) {
        (Some(k), _) => (k.kv.prefix.clone(), None, Some(k.clone())),
        (None, Some(PromptKv::Ready(p))) => (Some(p.clone()), None, None),
        (None, Some(PromptKv::Streaming(s))) => (None, Some(s.clone()), None),
        (None, None) => (None, None, None),
    };
    let private_tokens = prompt.len();
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
        constraint,
        keep,
        kept,
        client,
    };
    s.scheduler.submit_with(job, extras)?;
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
    let mut meta = StreamMeta {
        kind,
        id,
        created,
        model: s.cfg.model_id.clone(),
        include_usage: r.stream_options.is_some_and(|o| o.include_usage),
        echo,
        tool_calls,
        origin,
        private_tokens,
    };
    let text_of = token_text(s);
    if r.stream {
        return Ok(stream::respond(meta, rxs, text_of));
    }
    let mut answers = Vec::with_capacity(n);
    for rx in &mut rxs {
        answers.push(whole(rx).await?);
    }
    let done: Vec<&Done> = answers.iter().map(|(_, d)| d).collect();
    let usage = Usage::of(&done);
    let edgeprompt = meta.origin.block(&answers[0].1, private_tokens);
    let scored = |d| Scored {
        done: d,
        echo: meta.echo.as_ref(),
        text: &*text_of,
    };
    let object = kind.object(false);
    let body = match kind {
        Kind::Chat => Json(ChatCompletion {
            choices: answers
                .iter()
                .enumerate()
                .map(|(index, (text, d))| {
                    let (message, finish_reason) = message(text, d, meta.tool_calls.as_deref());
                    ChatChoice {
                        index,
                        message,
                        finish_reason,
                        logprobs: ChatLogprobs::of(&scored(d)),
                    }
                })
                .collect(),
            id: meta.id,
            object,
            created,
            model: meta.model,
            usage,
            edgeprompt,
        })
        .into_response(),
        Kind::Completion => Json(Completion {
            choices: answers
                .iter()
                .enumerate()
                .map(|(index, (text, d))| CompletionChoice {
                    index,
                    text: match &meta.echo {
                        Some(e) => format!("{}{text}", e.text),
                        None => text.clone(),
                    },
                    finish_reason: Some(d.finish_reason),
                    logprobs: CompletionLogprobs::of(&scored(d)),
                })
                .collect(),
            id: meta.id,
            object,
            created,
            model: meta.model,
            usage,
            edgeprompt,
        })
        .into_response(),
    };
    Ok(body)
}

/// A whole chat answer as the assistant's turn, with its calls read out when the request gave
/// tools (then `tool_calls` is its finish reason).
fn message(text: &str, d: &Done, names: Option<&[String]>) -> (AssistantMessage, &'static str) {
    let Some(names) = names else {
        let m = AssistantMessage {
            role: "assistant",
            content: Some(text.to_string()),
            tool_calls: None,
        };
        return (m, d.finish_reason);
    };
    let (content, calls) = tools::split_calls(text, names);
    let reason = match (calls.is_empty(), d.finish_reason) {
        (false, "stop") => "tool_calls",
        (_, r) => r,
    };
    let m = AssistantMessage {
        role: "assistant",
        content,
        tool_calls: (!calls.is_empty()).then_some(calls),
    };
    (m, reason)
}

/// One answer, whole.
async fn whole(rx: &mut mpsc::UnboundedReceiver<Event>) -> Result<(String, Done), ApiError> {
    let mut text = String::new();
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done(d)) => return Ok((text, d)),
            Some(Event::Failed(f)) => return Err(f.into()),
            None => return Err(Failure::internal("the scheduler dropped the request").into()),
        }
    }
}

/// A token id's text, for `logprobs`.
fn token_text(s: &EdgeServer) -> Arc<dyn Fn(u32) -> String + Send + Sync> {
    let model = s.model.clone();
    Arc::new(move |id| model.tokenizer.decode(&[id]).unwrap_or_default())
}
