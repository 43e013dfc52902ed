//! A streamed answer: server-sent events, the answers' chunks interleaved by `index`, each the
//! serialized response type of its endpoint; a failure after the first byte ends the stream
//! with the error the request would have had, then `[DONE]`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::error::ApiError;
use super::origin::Origin;
use super::request::ToolCall;
use super::response::{
    ChatChunkChoice, ChatCompletionChunk, ChatLogprobs, CompletionChoice, CompletionChunk,
    CompletionLogprobs, Delta, Echo, EdgepromptBlock, Kind, Scored, ToolCallDelta, Usage,
};
use super::tools::{self, CallStream};
use crate::scheduler::{Done, Event};

type TextOf = Arc<dyn Fn(u32) -> String + Send + Sync>;

/// What every chunk of one request carries, and what its answers are read for.
pub struct StreamMeta {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    pub echo: Option<Echo>,
    /// Read calls to these functions out of the answers' text.
    pub tool_calls: Option<Vec<String>>,
    pub origin: Origin,
    pub private_tokens: usize,
}

/// What one chunk says of answer `index`: the opening role, a text delta, or the end (its
/// finish reason, `logprobs`, which come whole at the end, and the `edgeprompt` block).
struct Piece<'a> {
    index: usize,
    text: Option<&'a str>,
    role: bool,
    finish: Option<(&'static str, &'a Done, EdgepromptBlock)>,
}

impl<'a> Piece<'a> {
    fn text(index: usize, text: &'a str) -> Self {
        Self {
            index,
            text: Some(text),
            role: false,
            finish: None,
        }
    }
}

fn event(v: &impl Serialize) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default().data(serde_json::to_string(v).unwrap_or_default()))
}

impl StreamMeta {
    fn chunk(&self, p: Piece, text_of: &TextOf) -> Result<SseEvent, Infallible> {
        let (finish_reason, done, edgeprompt) = match p.finish {
            Some((r, d, b)) => (Some(r), Some(d), Some(b)),
            None => (None, None, None),
        };
        let scored = |done| Scored {
            done,
            echo: self.echo.as_ref(),
            text: &**text_of,
        };
        match self.kind {
            Kind::Chat => event(&ChatCompletionChunk {
                id: self.id.clone(),
                object: self.kind.object(true),
                created: self.created,
                model: self.model.clone(),
                choices: vec![ChatChunkChoice {
                    index: p.index,
                    delta: Delta {
                        role: p.role.then_some("assistant"),
                        content: p.text.map(str::to_string),
                        tool_calls: None,
                    },
                    finish_reason,
                    logprobs: done.and_then(|d| ChatLogprobs::of(&scored(d))),
                }],
                usage: None,
                edgeprompt,
            }),
            Kind::Completion => event(&CompletionChunk {
                id: self.id.clone(),
                object: self.kind.object(true),
                created: self.created,
                model: self.model.clone(),
                choices: vec![CompletionChoice {
                    index: p.index,
                    text: p.text.unwrap_or("").to_string(),
                    finish_reason,
                    logprobs: done.and_then(|d| CompletionLogprobs::of(&scored(d))),
                }],
                usage: None,
                edgeprompt,
            }),
        }
    }

    /// A chat chunk carrying answer `index`'s `k`th tool call, whole.
    fn call(&self, index: usize, k: usize, call: ToolCall) -> Result<SseEvent, Infallible> {
        event(&ChatCompletionChunk {
            id: self.id.clone(),
            object: Kind::Chat.object(true),
            created: self.created,
            model: self.model.clone(),
            choices: vec![ChatChunkChoice {
                index,
                delta: Delta {
                    tool_calls: Some(vec![ToolCallDelta {
                        index: k,
                        id: call.id,
                        kind: call.kind,
                        function: call.function,
                    }]),
                    ..Delta::default()
                },
                finish_reason: None,
                logprobs: None,
            }],
            usage: None,
            edgeprompt: None,
        })
    }

    /// The last chunk when the client asked for usage in the stream.
    fn usage(&self, done: &[&Done]) -> Result<SseEvent, Infallible> {
        let (id, created, model) = (self.id.clone(), self.created, self.model.clone());
        let object = self.kind.object(true);
        let usage = Some(Usage::of(done));
        match self.kind {
            Kind::Chat => event(&ChatCompletionChunk {
                id,
                object,
                created,
                model,
                choices: Vec::new(),
                usage,
                edgeprompt: None,
            }),
            Kind::Completion => event(&CompletionChunk {
                id,
                object,
                created,
                model,
                choices: Vec::new(),
                usage,
                edgeprompt: None,
            }),
        }
    }

    /// One streamed piece of an answer read for tool calls: its text, or a call (the
    /// `sent`th).
    fn tool_piece(
        &self,
        index: usize,
        piece: tools::Streamed,
        sent: &mut usize,
        text_of: &TextOf,
    ) -> Result<SseEvent, Infallible> {
        match piece {
            tools::Streamed::Content(t) => self.chunk(Piece::text(index, &t), text_of),
            tools::Streamed::Call(c) => {
                *sent += 1;
                self.call(index, *sent - 1, c)
            }
        }
    }
}

/// Server-sent events for `rxs`, one receiver per answer. A client that goes away closes the
/// events' channel; the forwarder then drops the receivers, which the scheduler sees at its
/// next step and cancels the answers.
pub fn respond(
    mut m: StreamMeta,
    rxs: Vec<mpsc::UnboundedReceiver<Event>>,
    text_of: TextOf,
) -> Response {
    let (out, events) = mpsc::channel::<Result<SseEvent, Infallible>>(32);
    tokio::spawn(async move {
        let n = rxs.len();
        if m.kind == Kind::Chat {
            for index in 0..n {
                let open = Piece {
                    index,
                    text: Some(""),
                    role: true,
                    finish: None,
                };
                if out.send(m.chunk(open, &text_of)).await.is_err() {
                    return;
                }
            }
        }
        if let Some(e) = &m.echo {
            for i in 0..n {
                if out
                    .send(m.chunk(Piece::text(i, &e.text), &text_of))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
        let mut merged = tokio_stream::StreamMap::new();
        for (i, rx) in rxs.into_iter().enumerate() {
            merged.insert(i, tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
        }
        let mut done: Vec<Done> = Vec::new();
        let mut calls: Vec<(CallStream, usize)> = (0..n)
            .map(|_| (CallStream::new(m.tool_calls.clone().unwrap_or_default()), 0))
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
                    for p in parser.push(&t) {
                        msgs.push(m.tool_piece(i, p, sent, &text_of));
                    }
                }
                Some((i, Event::Text(t))) => msgs.push(m.chunk(Piece::text(i, &t), &text_of)),
                Some((i, Event::Done(d))) => {
                    let mut reason = d.finish_reason;
                    if m.tool_calls.is_some() {
                        let (parser, sent) = &mut calls[i];
                        for p in parser.finish() {
                            msgs.push(m.tool_piece(i, p, sent, &text_of));
                        }
                        if *sent > 0 && reason == "stop" {
                            reason = "tool_calls";
                        }
                    }
                    let block = m.origin.block(&d, m.private_tokens);
                    let last = Piece {
                        index: i,
                        text: None,
                        role: false,
                        finish: Some((reason, &d, block)),
                    };
                    msgs.push(m.chunk(last, &text_of));
                    done.push(d);
                }
                Some((_, Event::Failed(f))) => {
                    // The status the answer would have had, had it not begun already.
                    let e = ApiError::from(f);
                    let mut body = e.body();
                    body.error.status = Some(e.status.as_u16());
                    msgs.push(event(&body));
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
            let _ = out.send(m.usage(&d)).await;
        }
        let _ = out.send(Ok(SseEvent::default().data("[DONE]"))).await;
    });
    Sse::new(ReceiverStream::new(events))
        .keep_alive(KeepAlive::default())
        .into_response()
}
