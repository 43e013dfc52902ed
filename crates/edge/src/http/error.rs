//! Every way a request fails, as one error in OpenAI's shape: refusals before admission are
//! built where they are found (`validation.rs`); whatever fails after (a cloud prompt's
//! lookup, the scheduler's refusal, an answer that ended unfinished) is typed where it
//! happens and mapped to its status here, in one place each.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::response::ErrorBody;
use crate::prefixes::LookupError;
use crate::scheduler::{Failure, FailureKind, Refusal};

/// An error in OpenAI's shape.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub retry_after: Option<u64>,
    /// OpenAI's machine-readable `code` (e.g. `invalid_api_key`).
    pub code: Option<&'static str>,
    /// The request field at fault (OpenAI's `param`).
    pub param: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after: None,
            code: None,
            param: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// A 400 naming the field at fault.
    pub fn bad_param(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param),
            ..Self::bad_request(message)
        }
    }

    /// Too many requests, or no room now: retry in `secs`.
    pub fn busy(message: impl Into<String>, secs: u64) -> Self {
        Self {
            retry_after: Some(secs),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, message)
        }
    }

    /// The body: OpenAI's error object (with the status, in a stream that had begun).
    pub fn body(&self) -> ErrorBody {
        let mut body = ErrorBody::new(self.status.as_u16(), &self.message, self.code);
        body.error.param = self.param;
        body
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        r
    }
}

/// An answer that ended unfinished.
impl From<Failure> for ApiError {
    fn from(f: Failure) -> Self {
        let message = f.to_string();
        match f.kind {
            FailureKind::TimedOut => ApiError::new(StatusCode::GATEWAY_TIMEOUT, message),
            FailureKind::Stopped | FailureKind::Dead => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
            }
            FailureKind::Busy => ApiError::busy(message, 1),
            FailureKind::NoCloudPrompt => ApiError::new(StatusCode::BAD_GATEWAY, message),
            FailureKind::Internal => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message),
        }
    }
}

/// A cloud prompt that could not be had.
impl From<LookupError> for ApiError {
    fn from(e: LookupError) -> Self {
        match e {
            LookupError::UnknownSystem | LookupError::TooLong(_) => {
                ApiError::bad_request(e.to_string())
            }
            LookupError::UnknownId(_) => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
            LookupError::Disk(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            LookupError::Busy(_) => ApiError::busy(e.to_string(), 1),
            LookupError::Failed(m) => ApiError::new(
                StatusCode::BAD_GATEWAY,
                format!("could not get the cloud prompt: {m}"),
            ),
        }
    }
}

/// A job the scheduler would not take.
impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Invalid(m) => ApiError::bad_request(m),
            Refusal::Full {
                retry_after_secs,
                reason,
            } => ApiError::busy(reason, retry_after_secs),
            Refusal::Stopped => ApiError {
                retry_after: Some(1),
                ..ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "this edge is shutting down; retry on another",
                )
            },
            Refusal::Dead(why) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, why),
        }
    }
}
