//! Being alive, ready and draining. `/health` answers while the process lives (with
//! `"status": "draining"` once it stops admitting); `/ready` says whether a new request can be
//! served now; a drain refuses new API requests with 503 + `Retry-After`, lets the running
//! ones finish within a deadline, ends the rest with a reason, and completes the disk tier.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::{ApiError, EdgeServer};

/// Seconds a refused client is told to wait (another replica should take it meanwhile).
const RETRY_AFTER_SECS: u64 = 5;

/// How a drain ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drained {
    /// Answers still pending at the deadline, ended with "shut down".
    pub cut: usize,
    /// Disk writes still unfinished when the flush gave up.
    pub unflushed: usize,
    pub took: Duration,
}

impl EdgeServer {
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Stop admitting, wait up to `within` for API requests in progress (some still looking up
    /// their cloud prompt) and admitted answers to end, end the rest, then wait (up to 10 s)
    /// for the disk tier's writes.
    pub async fn drain(&self, within: Duration) -> Drained {
        let start = Instant::now();
        self.draining.store(true, Ordering::Release);
        self.metrics.draining.set(1);
        let busy = || self.in_flight.load(Ordering::Acquire) > 0 || self.scheduler.pending() > 0;
        while busy() && start.elapsed() < within {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let cut = self.scheduler.pending();
        // Refuse whatever a late handler still submits, and end what runs.
        self.scheduler.stop();
        let unflushed = self.prefixes.flush(Duration::from_secs(10)).await;
        Drained {
            cut,
            unflushed,
            took: start.elapsed(),
        }
    }
}

/// Counts an API request in progress until dropped.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// In front of the API: counts the requests in progress (a drain waits for them) and answers
/// 503 + `Retry-After` once draining.
pub async fn refuse_when_draining(
    State(s): State<Arc<EdgeServer>>,
    req: Request,
    next: Next,
) -> Response {
    // Counted before the check, so a drain that starts in between still waits for it.
    s.in_flight.fetch_add(1, Ordering::AcqRel);
    let _guard = InFlight(&s.in_flight);
    if let Some(why) = s.scheduler.dead() {
        return ApiError {
            code: Some("scheduler_dead"),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, why)
        }
        .into_response();
    }
    if s.is_draining() {
        return ApiError {
            retry_after: Some(RETRY_AFTER_SECS),
            code: Some("draining"),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "this edge is shutting down and admits no new requests; retry on another",
            )
        }
        .into_response();
    }
    next.run(req).await
}

/// `GET /ready`: 200 when a new request can be served now (the scheduler alive, not
/// draining, and the cloud answers or prompts can be computed here), else 503; the body says
/// which part is missing.
pub async fn ready(State(s): State<Arc<EdgeServer>>) -> Response {
    if let Some(why) = s.scheduler.dead() {
        let body = json!({"ready": false, "dead": true, "reason": why});
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    let cloud = s.prefixes.cloud_reachable().await;
    let local = s.prefixes.computes_locally();
    let draining = s.is_draining();
    let ready = !draining && (cloud != Some(false) || local);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let cloud = match cloud {
        None => "none",
        Some(true) => "reachable",
        Some(false) => "unreachable",
    };
    let body = json!({
        "ready": ready,
        "draining": draining,
        "cloud": cloud,
        "local_compute": local,
    });
    (status, Json(body)).into_response()
}
