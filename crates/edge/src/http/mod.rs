//! The edge's OpenAI-compatible HTTP API. The leading system message becomes the cloud prompt
//! (resolved by content address, or named by `cloud_prompt`); every other message is the
//! private edge prompt and never leaves this node.

pub mod access;
mod answer;
mod chat;
mod completions;
pub mod conn;
mod error;
pub mod lifecycle;
mod models;
mod origin;
mod page;
pub mod request;
pub mod response;
pub mod schema;
mod stream;
mod tokens;
mod tools;
mod validation;

pub use error::ApiError;
#[doc(hidden)]
pub use validation::check_request;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{middleware, Router};
use edgeprompt_engine::{Constraint, Grammars, Model, Spec};

use crate::metrics::Metrics;
use crate::prefixes::{PrefixConfig, Prefixes};
use crate::scheduler::{Scheduler, SchedulerConfig};

pub struct ServerConfig {
    /// The name clients pass as `model`.
    pub model_id: String,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: usize,
    /// Bearer keys `/v1/*` requires (none: open).
    pub api_keys: access::ApiKeys,
}

pub struct EdgeServer {
    pub model: Arc<Model>,
    pub scheduler: Scheduler,
    pub prefixes: Arc<Prefixes>,
    pub metrics: Arc<Metrics>,
    pub cfg: ServerConfig,
    /// Set by `drain`: new API requests get 503.
    draining: AtomicBool,
    /// API requests between the door and the end of their handler.
    in_flight: std::sync::atomic::AtomicUsize,
    /// The grammar compiler over this model's vocabulary, built at the first constrained
    /// request.
    grammars: std::sync::OnceLock<Result<Arc<Grammars>, String>>,
    /// Large bodies parsed and tokenized at once (see `gate`).
    large: Arc<tokio::sync::Semaphore>,
    /// Finished conversations' KV for their next turns (memory only, per caller).
    pub private: Arc<crate::private_cache::PrivateCache>,
}

impl EdgeServer {
    /// Start the scheduler thread and build the server's state.
    pub fn start(
        model: Arc<Model>,
        cfg: ServerConfig,
        scheduler: SchedulerConfig,
        prefixes: PrefixConfig,
    ) -> std::io::Result<Arc<Self>> {
        let metrics = Arc::new(Metrics::new());
        // Sliding-window models keep no conversations yet (their cut layers are not tested
        // across turns).
        let private_bytes = if model.cfg.window.is_some() {
            0
        } else {
            scheduler.private_cache_bytes
        };
        let prefixes = Arc::new(
            Prefixes::new(model.clone(), prefixes, metrics.clone())
                .map_err(|e| std::io::Error::other(e.to_string()))?,
        );
        prefixes.start_prefetch();
        Ok(Arc::new(Self {
            private: Arc::new(crate::private_cache::PrivateCache::new(private_bytes)),
            scheduler: Scheduler::start(model.clone(), scheduler, metrics.clone())?,
            prefixes,
            model,
            metrics,
            cfg,
            draining: AtomicBool::new(false),
            in_flight: Default::default(),
            grammars: Default::default(),
            large: Arc::new(tokio::sync::Semaphore::new(2)),
        }))
    }

    /// Compile `spec` on a blocking thread: the vocabulary's trie takes ~0.5 s the first time
    /// (Qwen2.5), a large schema some milliseconds.
    pub async fn constraint(self: &Arc<Self>, spec: Spec) -> Result<Constraint, ApiError> {
        let s = self.clone();
        let r = tokio::task::spawn_blocking(move || {
            let g = s
                .grammars
                .get_or_init(|| {
                    Grammars::for_model(&s.model)
                        .map(Arc::new)
                        .map_err(|e| e.to_string())
                })
                .clone()
                .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
            g.constraint(&spec)
                .map_err(|e| ApiError::bad_request(e.to_string()))
        })
        .await;
        r.map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    }
}

/// The API under `/v1` (behind the API keys when set; refused while draining), the chat page
/// at `/` and the operator's `/health`, `/ready` and `/metrics`; every response carries its
/// request id.
pub fn router(state: Arc<EdgeServer>) -> Router {
    router_with(state, conn::ConnLimits::default().body)
}

/// `router`, with request bodies given `body` to arrive whole.
fn router_with(state: Arc<EdgeServer>, body: std::time::Duration) -> Router {
    let keys = Arc::new(state.cfg.api_keys.clone());
    let limits = BodyLimits::of(&state.model);
    let api = Router::new()
        .route(
            "/v1/chat/completions",
            post(chat::chat).layer(DefaultBodyLimit::max(limits.text)),
        )
        .route(
            "/v1/completions",
            post(completions::completions).layer(DefaultBodyLimit::max(limits.text)),
        )
        .route("/v1/models", get(models::models))
        .route("/v1/cloud_prompts", get(models::cloud_prompts))
        .route(
            "/tokenize",
            post(tokens::tokenize).layer(DefaultBodyLimit::max(limits.text)),
        )
        .route(
            "/detokenize",
            post(tokens::detokenize).layer(DefaultBodyLimit::max(limits.ids)),
        )
        .route("/tokenizer_info", get(tokens::tokenizer_info))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            lifecycle::refuse_when_draining,
        ))
        .route_layer(middleware::from_fn_with_state(
            keys.clone(),
            access::require_key,
        ));
    Router::new()
        .route("/", get(page::index))
        .route("/page.js", get(page::script))
        .route("/health", get(lifecycle::health))
        .route("/ready", get(lifecycle::ready))
        .route(
            "/metrics",
            get(lifecycle::metrics).route_layer(middleware::from_fn_with_state(
                keys.clone(),
                access::require_admin,
            )),
        )
        .route("/openapi.json", get(openapi))
        .merge(api)
        .layer(middleware::from_fn_with_state(
            (body, limits.text.max(limits.ids)),
            conn::body_deadline,
        ))
        .layer(middleware::from_fn(access::request_id))
        .with_state(state)
}

/// The most bytes a request body may have, per kind of endpoint: text that could still fit
/// the model's context (32 bytes a token covers any text escaped in JSON), or its token ids.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    pub text: usize,
    pub ids: usize,
}

impl BodyLimits {
    pub fn of(model: &Model) -> Self {
        let ctx = model.max_positions();
        Self {
            text: ctx * 32 + (64 << 10),
            ids: ctx * 12 + (4 << 10),
        }
    }
}

/// A body this large is parsed and tokenized through a narrow door: tokenizing it costs about
/// a hundred times its size in memory, so two at a time at most, and the allocator gives the
/// memory back to the system afterwards (a flood does not leave the process swollen).
const LARGE_BODY: usize = 64 << 10;

/// How long a large body waits for the door before it is refused (429).
const LARGE_BODY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Held while a large body is parsed and tokenized (`EdgeServer::gate`).
pub struct Gate {
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Gate {
    fn drop(&mut self) {
        give_back_memory();
    }
}

impl EdgeServer {
    /// The door for a body of `len` bytes: none for a small one.
    pub async fn gate(self: &Arc<Self>, len: usize) -> Result<Option<Gate>, ApiError> {
        if len < LARGE_BODY {
            return Ok(None);
        }
        match tokio::time::timeout(LARGE_BODY_WAIT, self.large.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(Some(Gate { _permit: p })),
            _ => Err(ApiError {
                retry_after: Some(1),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too many large requests are being read; retry later",
                )
            }),
        }
    }
}

/// Return the allocator's free memory to the system (glibc keeps it otherwise).
pub(crate) fn give_back_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// `GET /openapi.json`: the description of this API, naming the model this server serves.
async fn openapi(
    axum::extract::State(s): axum::extract::State<Arc<EdgeServer>>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        schema::openapi_json(Some(&s.cfg.model_id)),
    )
        .into_response()
}

/// Serve until the listener fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<EdgeServer>,
) -> std::io::Result<()> {
    serve_until(listener, state, std::future::pending()).await
}

/// Serve until `stop` resolves (then finish the open requests) or the listener fails, with
/// the default connection bounds.
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    state: Arc<EdgeServer>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, state, conn::ConnLimits::default(), stop).await
}

/// `serve_until` with these connection bounds.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    state: Arc<EdgeServer>,
    limits: conn::ConnLimits,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    conn::serve(listener, router_with(state, limits.body), limits, stop).await
}
