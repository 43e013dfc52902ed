//! The chat page at `/`: two static files compiled into the binary (no build step). It calls
//! the same API as any client, with the API key the user types when the edge asks for one.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/page.js");

/// Scripts only from this origin, and nothing sent anywhere else.
const POLICY: &str = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
                      frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The chat page.
#[utoipa::path(get, path = "/", operation_id = "page", responses(
    (status = 200, description = "The page", content((String = "text/html"))),
))]
pub async fn index() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        INDEX,
    )
        .into_response()
}

/// The chat page's script.
#[utoipa::path(get, path = "/page.js", operation_id = "page_script", responses(
    (status = 200, description = "The script", content((String = "text/javascript"))),
))]
pub async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        SCRIPT,
    )
        .into_response()
}
