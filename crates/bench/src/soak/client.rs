//! The soak's clients: one request each, over real HTTP, ending in exactly one outcome.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

/// One request of the seeded load.
#[derive(Debug, Clone, Serialize)]
pub struct Spec {
    pub id: usize,
    /// Seconds after the load starts.
    pub at: f64,
    pub edge: usize,
    pub system: String,
    pub user: String,
    pub max_tokens: usize,
    pub stream: bool,
    /// The client goes away after this many streamed pieces of text.
    pub cancel_after: Option<usize>,
    /// Sent by the chaos schedule (a burst that fills the KV budget, prompts for a
    /// disk that cannot be written), not the load.
    pub by_chaos: bool,
    /// Sent only once the fault of this index has been applied (at `at` or after): what it
    /// tests needs the fault in place, however late a slow machine applies it.
    pub after_fault: Option<usize>,
}

/// How a request ended, as its client saw it.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// The whole answer.
    Answer { text: String, ttft_s: f64 },
    /// An HTTP error with OpenAI's error body (its message kept).
    Refused { status: u16, message: String },
    /// An error event in the stream, with its message.
    StreamError { message: String },
    /// The client hung up on purpose.
    Cancelled,
    /// The connection failed or the stream ended without `[DONE]`: a defect.
    Broken { what: String },
    /// No end within the client's timeout: a defect.
    Hang,
}

impl Outcome {
    pub fn kind(&self) -> String {
        match self {
            Outcome::Answer { .. } => "answer".into(),
            Outcome::Refused { status, .. } => format!("http_{status}"),
            Outcome::StreamError { .. } => "stream_error".into(),
            Outcome::Cancelled => "cancelled".into(),
            Outcome::Broken { .. } => "broken".into(),
            Outcome::Hang => "hang".into(),
        }
    }
}

/// Send `spec` to `base` (`http://host:port`, serving `model`); never returns later than
/// `timeout`.
pub async fn send(
    http: &reqwest::Client,
    base: &str,
    model: &str,
    spec: &Spec,
    timeout: Duration,
) -> Outcome {
    match tokio::time::timeout(timeout, run(http, base, model, spec)).await {
        Ok(o) => o,
        Err(_) => Outcome::Hang,
    }
}

async fn run(http: &reqwest::Client, base: &str, model: &str, spec: &Spec) -> Outcome {
    let body = json!({
        "model": model,
        "messages": [
            {"role": "system", "content": spec.system},
            {"role": "user", "content": spec.user},
        ],
        "max_tokens": spec.max_tokens,
        "temperature": 0,
        "stream": spec.stream,
    });
    let t0 = Instant::now();
    let resp = match http
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => {
            return Outcome::Broken {
                what: format!("send: {e}"),
            }
        }
    };
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(String::from))
            .unwrap_or_default();
        if message.is_empty() {
            return Outcome::Broken {
                what: format!("{status} without an error message: {text}"),
            };
        }
        return Outcome::Refused {
            status: status.as_u16(),
            message,
        };
    }
    if !spec.stream {
        let body = resp.text().await;
        let v: Value = match body
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_str(&b).map_err(|e| e.to_string()))
        {
            Ok(v) => v,
            Err(e) => {
                return Outcome::Broken {
                    what: format!("body: {e}"),
                }
            }
        };
        return match v["choices"][0]["message"]["content"].as_str() {
            Some(t) => Outcome::Answer {
                text: t.into(),
                ttft_s: t0.elapsed().as_secs_f64(),
            },
            None => Outcome::Broken {
                what: format!("no content in {v}"),
            },
        };
    }
    stream(resp, spec, t0).await
}

async fn stream(mut resp: reqwest::Response, spec: &Spec, t0: Instant) -> Outcome {
    let (mut buf, mut text, mut pieces, mut ttft, mut finished) =
        (String::new(), String::new(), 0, None, false);
    loop {
        let bytes = match resp.chunk().await {
            Ok(Some(b)) => b,
            Ok(None) => {
                return Outcome::Broken {
                    what: "stream ended without [DONE]".into(),
                }
            }
            Err(e) => {
                return Outcome::Broken {
                    what: format!("stream: {e}"),
                }
            }
        };
        buf.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(i) = buf.find('\n') {
            let line: String = buf.drain(..=i).collect();
            let Some(data) = line.trim().strip_prefix("data:").map(str::trim) else {
                continue;
            };
            if data == "[DONE]" {
                return if finished {
                    Outcome::Answer {
                        text,
                        ttft_s: ttft.unwrap_or(f64::NAN),
                    }
                } else {
                    Outcome::Broken {
                        what: "[DONE] before a finish reason".into(),
                    }
                };
            }
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                return Outcome::Broken {
                    what: format!("not JSON: {data}"),
                };
            };
            if let Some(m) = v["error"]["message"].as_str() {
                return Outcome::StreamError { message: m.into() };
            }
            let piece = v["choices"][0]["delta"]["content"].as_str().unwrap_or("");
            if !piece.is_empty() {
                ttft.get_or_insert(t0.elapsed().as_secs_f64());
                text.push_str(piece);
                pieces += 1;
                if spec.cancel_after.is_some_and(|n| pieces >= n) {
                    return Outcome::Cancelled;
                }
            }
            finished |= v["choices"][0]["finish_reason"].is_string();
        }
    }
}
