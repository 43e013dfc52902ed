//! Who may call the API and how a request is named: bearer API keys on `/v1/*` (401 in
//! OpenAI's error shape otherwise), and a request id on every response and log line.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tracing::Instrument;

use super::ApiError;

/// The header a request id travels in, both ways.
pub const REQUEST_ID: &str = "x-request-id";

/// The id of one request: the client's `x-request-id` when it is a plain token, else a new
/// random one. Handlers read it (as an extension) to name their completions.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

impl RequestId {
    fn from_client(v: &HeaderValue) -> Option<Self> {
        let s = v.to_str().ok()?;
        let plain = (1..=64).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        plain.then(|| Self(s.to_string()))
    }

    fn new() -> Self {
        Self(format!("req-{:016x}", rand::random::<u64>()))
    }
}

/// Give the request its id, log under it, and return it in the response's header.
pub async fn request_id(mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get(REQUEST_ID)
        .and_then(RequestId::from_client)
        .unwrap_or_else(RequestId::new);
    req.extensions_mut().insert(id.clone());
    let span = tracing::info_span!("request", id = %id.0, path = %req.uri().path());
    let mut resp = next.run(req).instrument(span).await;
    if let Ok(v) = HeaderValue::from_str(&id.0) {
        resp.headers_mut().insert(REQUEST_ID, v);
    }
    resp
}

/// The keys a client may present, kept as SHA-256 digests (equal length, so comparing them
/// reveals nothing about a key's length); empty means the API is open. Beside them, the
/// operator's admin keys: with API keys set, `/metrics` answers only to an admin key (it
/// counts every tenant's requests, so no tenant reads it).
#[derive(Default, Clone)]
pub struct ApiKeys(Vec<[u8; 32]>, Vec<[u8; 32]>);

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys, {} admin)", self.0.len(), self.1.len())
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl ApiKeys {
    /// Keys given on the command line plus those in `file` (one per line; blank lines and
    /// lines starting with `#` skipped), trimmed. An empty `--api-key`, or a file with no key,
    /// is an error: either would leave the API open by mistake.
    pub fn new(keys: Vec<String>, file: Option<&Path>) -> std::io::Result<Self> {
        let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
        let mut all: Vec<String> = keys.iter().map(|k| k.trim().to_string()).collect();
        if all.iter().any(String::is_empty) {
            return Err(invalid("an --api-key is empty".into()));
        }
        if let Some(f) = file {
            let text = std::fs::read_to_string(f)?;
            let before = all.len();
            all.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_string),
            );
            if all.len() == before {
                return Err(invalid(format!("{} holds no API key", f.display())));
            }
        }
        Ok(Self(all.iter().map(|k| digest(k)).collect(), Vec::new()))
    }

    /// These keys with the operator's admin keys (`admin`, trimmed; an empty one is an error).
    /// An admin key is not an API key: it opens `/metrics`, not `/v1/*`.
    pub fn with_admin(mut self, admin: &[String]) -> std::io::Result<Self> {
        for k in admin.iter().map(|k| k.trim()) {
            if k.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "an admin key is empty",
                ));
            }
            self.1.push(digest(k));
        }
        Ok(self)
    }

    /// The keys in an environment variable's value (`name` for errors): comma- or
    /// newline-separated, trimmed, empty entries skipped. A value with no key is an error, as
    /// an empty file is.
    pub fn list_from_env(name: &str, value: &str) -> std::io::Result<Vec<String>> {
        let keys: Vec<String> = value
            .split([',', '\n'])
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .collect();
        if keys.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{name} is set but holds no API key"),
            ));
        }
        Ok(keys)
    }

    pub fn is_open(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `presented` is one of the keys; every key is compared in constant time, so the
    /// timing tells neither which key nor how much of one matched.
    pub fn admits(&self, presented: &str) -> bool {
        any_is(&self.0, presented)
    }

    /// Whether `presented` is an admin key (compared as `admits` compares).
    pub fn admits_admin(&self, presented: &str) -> bool {
        any_is(&self.1, presented)
    }
}

fn any_is(keys: &[[u8; 32]], presented: &str) -> bool {
    let p = digest(presented);
    keys.iter()
        .fold(false, |ok, k| ok | bool::from(k.ct_eq(&p)))
}

/// The bearer key of a request, if it sends one.
fn bearer(req: &Request) -> Option<&str> {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key.trim())
}

/// The operator's routes (`/metrics`): open on an open API; with API keys set, only to an
/// admin key (none configured: to no one), since they count every tenant's traffic.
pub async fn require_admin(State(keys): State<Arc<ApiKeys>>, req: Request, next: Next) -> Response {
    if keys.is_open() {
        return next.run(req).await;
    }
    match bearer(&req) {
        Some(k) if keys.admits_admin(k) => next.run(req).await,
        _ if keys.1.is_empty() => unauthorized(
            "/metrics needs the operator's admin key, and this edge has none \
             (--admin-key-file or EDGEPROMPT_ADMIN_KEY)",
        ),
        _ => unauthorized("/metrics needs the operator's admin key."),
    }
}

/// The caller's API key, as its SHA-256 (set on admitted requests when keys are configured):
/// what scopes its private prefix cache.
#[derive(Debug, Clone, Copy)]
pub struct Caller(pub [u8; 32]);

/// Refuse `/v1/*` calls without a valid `Authorization: Bearer <key>` when keys are set.
pub async fn require_key(
    State(keys): State<Arc<ApiKeys>>,
    mut req: Request,
    next: Next,
) -> Response {
    if keys.is_open() {
        return next.run(req).await;
    }
    match bearer(&req) {
        Some(k) if keys.admits(k) => {
            let caller = Caller(digest(k));
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Some(_) => unauthorized("Incorrect API key provided."),
        None => {
            unauthorized("You didn't provide an API key. Send it as `Authorization: Bearer <key>`.")
        }
    }
}

fn unauthorized(message: &str) -> Response {
    tracing::info!("refused: {message}");
    let mut e = ApiError::new(StatusCode::UNAUTHORIZED, message);
    e.code = Some("invalid_api_key");
    e.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_from_flags_and_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("keys");
        std::fs::write(&f, "# team keys\nsk-one\n\n  sk-two  \n").unwrap();
        let keys = ApiKeys::new(vec![" sk-flag".into()], Some(&f)).unwrap();
        for k in ["sk-flag", "sk-one", "sk-two"] {
            assert!(keys.admits(k), "{k}");
        }
        for k in ["", "sk-on", "sk-one ", "# team keys"] {
            assert!(!keys.admits(k), "{k:?}");
        }
        assert!(ApiKeys::new(vec![" ".into()], None).is_err());
        let empty = dir.path().join("none");
        std::fs::write(&empty, "# nobody yet\n\n").unwrap();
        assert!(
            ApiKeys::new(vec![], Some(&empty)).is_err(),
            "an empty file must not open the API"
        );
        assert_eq!(
            format!("{keys:?}"),
            "ApiKeys(3 keys, 0 admin)",
            "no secret in Debug"
        );
        let keys = keys.with_admin(&[" sk-admin ".into()]).unwrap();
        assert!(keys.admits_admin("sk-admin") && !keys.admits("sk-admin"));
        assert!(!keys.admits_admin("sk-one"));
        assert!(ApiKeys::default().with_admin(&["".into()]).is_err());
        assert!(ApiKeys::new(vec![], None).unwrap().is_open());
    }

    #[test]
    fn keys_come_from_an_environment_value() {
        let keys = ApiKeys::list_from_env("K", " sk-a, sk-b\nsk-c\r\n,\n").unwrap();
        assert_eq!(keys, ["sk-a", "sk-b", "sk-c"]);
        for empty in ["", " , \n"] {
            let e = ApiKeys::list_from_env("K", empty).unwrap_err();
            assert!(e.to_string().contains("K is set"), "{e}");
        }
    }

    #[test]
    fn only_plain_client_ids_are_kept() {
        let ok = HeaderValue::from_static("abc-123_x.y");
        assert_eq!(RequestId::from_client(&ok).unwrap().0, "abc-123_x.y");
        for bad in ["", "has space", "new\tline", &"x".repeat(65)] {
            let v = HeaderValue::from_str(bad).unwrap();
            assert!(RequestId::from_client(&v).is_none(), "{bad:?}");
        }
    }
}
