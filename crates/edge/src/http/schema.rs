//! The OpenAPI description of the HTTP API (`GET /openapi.json`), gathered from the handlers'
//! own `#[utoipa::path]` attributes, the request types (`request.rs`) and the response types
//! (`response.rs`) that are serialized: nothing is described twice. `schemathesis` checks the
//! running server against it (`scripts/openapi_check.sh`).

use std::collections::BTreeMap;

use utoipa::openapi::{ContentBuilder, RefOr, ResponseBuilder};
use utoipa::{IntoResponses, OpenApi};

use super::response::{ChatCompletionChunk, CompletionChunk, ErrorBody};
use super::{chat, completions, lifecycle, models, page, tokens, ApiError};

/// How a generation request is refused or ended: every status an `ApiError` takes there,
/// each with OpenAI's error body.
impl IntoResponses for ApiError {
    fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::response::Response>> {
        [
            (400, "A request the server cannot serve"),
            (401, "No or a wrong API key"),
            (404, "Another model, or an unknown cloud prompt"),
            (413, "A body larger than the model's context could hold"),
            (422, "A body that is not the request"),
            (
                429,
                "KV budget, queue or prompts computed here full; retry later",
            ),
            (500, "An internal fault ended this request"),
            (502, "The cloud prompt could not be had"),
            (503, "Draining, or the scheduler is dead"),
            (504, "The request timed out"),
        ]
        .into_iter()
        .map(|(status, description)| {
            let body = ContentBuilder::new()
                .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                    "ErrorBody",
                ))))
                .build();
            let response = ResponseBuilder::new()
                .description(description)
                .content("application/json", body)
                .build();
            (status.to_string(), RefOr::T(response))
        })
        .collect()
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "EdgePrompt edge",
        description = "OpenAI-compatible API of an EdgePrompt edge: the leading system message is the cloud prompt (its KV from the cloud), the rest stays on the edge."
    ),
    paths(
        chat::chat,
        completions::completions,
        models::models,
        models::cloud_prompts,
        page::index,
        page::script,
        lifecycle::health,
        lifecycle::ready,
        lifecycle::metrics,
        tokens::tokenize,
        tokens::detokenize,
        tokens::tokenizer_info
    ),
    components(schemas(ChatCompletionChunk, CompletionChunk, ErrorBody))
)]
pub struct ApiDoc;

/// The description as JSON; with `model`, the one model name this server takes.
pub fn openapi_json(model: Option<&str>) -> String {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    if let Some(m) = model {
        doc["components"]["schemas"]["Sampling"]["properties"]["model"]["enum"] =
            serde_json::json!([m]);
    }
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn the_description_names_every_route_and_the_request_fields() {
        let doc: Value = serde_json::from_str(&openapi_json(Some("m"))).unwrap();
        assert_eq!(
            doc["components"]["schemas"]["Sampling"]["properties"]["model"]["enum"][0],
            "m"
        );
        for p in [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/models",
            "/health",
            "/ready",
            "/metrics",
        ] {
            assert!(doc["paths"][p].is_object(), "{p}");
        }
        let text = doc.to_string();
        for field in [
            "max_tokens",
            "cloud_prompt",
            "messages",
            "top_logprobs",
            "stop",
        ] {
            assert!(text.contains(field), "{field}");
        }
    }
}
