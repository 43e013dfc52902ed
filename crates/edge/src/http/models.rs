//! What a client may ask for: the model this edge serves (`GET /v1/models`) and the cloud
//! prompts a request may name (`GET /v1/cloud_prompts`).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;

use super::response::{CloudPromptList, ModelCard, ModelList};
use super::EdgeServer;

/// The model this edge serves.
#[utoipa::path(get, path = "/v1/models", responses(
    (status = 200, description = "One model", body = ModelList),
    (status = 401, description = "No or a wrong API key", body = super::response::ErrorBody),
    (status = 503, description = "Draining, or the scheduler is dead", body = super::response::ErrorBody),
))]
pub async fn models(State(s): State<Arc<EdgeServer>>) -> Json<ModelList> {
    s.metrics.request("/v1/models", "200");
    Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: s.cfg.model_id.clone(),
            object: "model",
            created: 0,
            owned_by: "edgeprompt",
            context_length: s.model.max_positions(),
            max_model_len: s.model.max_positions(),
        }],
    })
}

/// The cloud prompts a request may name (`cloud_prompt`): the cloud's and those held here.
#[utoipa::path(get, path = "/v1/cloud_prompts", responses(
    (status = 200, description = "The prompts", body = CloudPromptList),
    (status = 401, description = "No or a wrong API key", body = super::response::ErrorBody),
    (status = 503, description = "Draining, or the scheduler is dead", body = super::response::ErrorBody),
))]
pub async fn cloud_prompts(State(s): State<Arc<EdgeServer>>) -> Json<CloudPromptList> {
    let (data, cloud) = s.prefixes.named().await;
    s.metrics.request("/v1/cloud_prompts", "200");
    let state = match (&cloud, s.prefixes.has_cloud()) {
        (_, false) => "none",
        (Ok(()), true) => "reachable",
        (Err(_), true) => "unreachable",
    };
    Json(CloudPromptList {
        object: "list",
        data,
        cloud: state,
        cloud_error: cloud.err(),
    })
}
