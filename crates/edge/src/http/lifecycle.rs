//! Being alive, ready and draining. `/health` answers while the process lives (with
//! `"status": "draining"` once it stops admitting); `/ready` says whether a new request can be
//! served now; a drain refuses new API requests with 503 + `Retry-After`, lets the running
//! ones finish within a deadline, ends the rest with a reason, and completes the disk tier.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::response::{Health, Ready};
use super::{ApiError, EdgeServer};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

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

/// Whether a new request can be served now.
///
/// 200 when the scheduler is alive, the edge not draining, and the cloud answers or prompts
/// can be computed here; else 503, the body saying which part is missing.
#[utoipa::path(get, path = "/ready", responses(
    (status = 200, description = "Ready", body = Ready),
    (status = 503, description = "Draining, cloud unreachable, or dead", body = Ready),
))]
pub async fn ready(State(s): State<Arc<EdgeServer>>) -> (StatusCode, Json<Ready>) {
    if let Some(why) = s.scheduler.dead() {
        let body = Ready {
            ready: false,
            dead: Some(true),
            reason: Some(why),
            ..Ready::default()
        };
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body));
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
    let body = Ready {
        ready,
        draining: Some(draining),
        cloud: Some(cloud),
        local_compute: Some(local),
        ..Ready::default()
    };
    (status, Json(body))
}

/// Alive (200, draining or not), or dead or in a key conflict (503, with the reason).
///
/// An orchestrator restarts a dead edge; an operator settles which key is the cloud's.
#[utoipa::path(get, path = "/health", responses(
    (status = 200, description = "Serving", body = Health),
    (status = 503, description = "The scheduler is dead, or the cloud shows another signing key than the pinned one", body = Health),
))]
pub async fn health(State(s): State<Arc<EdgeServer>>) -> (StatusCode, Json<Health>) {
    let u = s.scheduler.usage();
    let dead = s.scheduler.dead();
    let conflict = s.prefixes.trust_conflict();
    let status = match (&dead, &conflict, s.is_draining()) {
        (Some(_), _, _) => "dead",
        (None, Some(_), _) => "key_conflict",
        (None, None, true) => "draining",
        (None, None, false) => "ok",
    };
    // A key conflict: the edge still answers (computing prompts here) but an operator must
    // settle which key is the cloud's.
    let reason = dead.or(conflict);
    let code = match reason {
        Some(_) => StatusCode::SERVICE_UNAVAILABLE,
        None => StatusCode::OK,
    };
    let body = Health {
        status,
        pending_requests: s.scheduler.pending(),
        model: s.cfg.model_id.clone(),
        fingerprint: s.model.fingerprint.clone(),
        active_sequences: u.sequences,
        reason,
    };
    (code, Json(body))
}

/// Prometheus metrics (OpenMetrics text).
#[utoipa::path(get, path = "/metrics", responses(
    (status = 200, description = "Metrics", content((String = "application/openmetrics-text"))),
    (status = 401, description = "API keys are set and no admin key was sent", body = super::response::ErrorBody),
))]
pub async fn metrics(State(s): State<Arc<EdgeServer>>) -> Response {
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
