//! A cloud prompt whose stream breaks after its header is computed here, and the answer says
//! so: the response's `edgeprompt.cloud_prompt.source` is `local`, not `cloud`, and the answer
//! is the single node's.

use std::sync::Arc;

use edgeprompt_cloud::{CloudNode, CloudService};
use edgeprompt_protocol::cloud_kv_server::{CloudKv, CloudKvServer};
use edgeprompt_protocol::fetch_message::Body;
use edgeprompt_protocol::{FetchMessage, FetchRequest, ListReply, ListRequest};
use serde_json::json;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};

use crate::common;
use common::{model, post_json, SUPPORT};

type FetchStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<FetchMessage, Status>> + Send>>;

/// The cloud's service with one byte of its third layer's first chunk flipped (its checksum
/// then fails on the edge).
struct Breaks(CloudService);

#[tonic::async_trait]
impl CloudKv for Breaks {
    type FetchStream = FetchStream;

    async fn list(&self, req: Request<ListRequest>) -> Result<Response<ListReply>, Status> {
        self.0.list(req).await
    }

    async fn fetch(&self, req: Request<FetchRequest>) -> Result<Response<FetchStream>, Status> {
        let inner = self.0.fetch(req).await?.into_inner();
        let mut broke = false;
        Ok(Response::new(Box::pin(inner.map(move |m| {
            let mut m = m?;
            if let Some(Body::Chunk(c)) = &mut m.body {
                if c.layer == 2 && !broke {
                    broke = true;
                    if let Some(b) = c.payload.first_mut() {
                        *b ^= 0x55;
                    }
                }
            }
            Ok(m)
        }))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_breaks_after_its_header_is_answered_as_computed_here() {
    let m = model();
    let node = Arc::new(CloudNode::new(m.clone(), &common::prompt_specs(), 64 << 20).unwrap());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cloud = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                CloudKvServer::new(Breaks(CloudService(node))).max_encoding_message_size(64 << 20),
            )
            .serve_with_incoming(TcpListenerStream::new(l)),
    );
    let addr = common::http_edge(&m, common::prefix_config(&cloud)).await;
    let user = "Can I bring my bike?";
    let single = common::single_node_text(&m, SUPPORT, user, 6);
    let body = json!({
        "model": "smollm2",
        "messages": [{"role": "system", "content": SUPPORT}, {"role": "user", "content": user}],
        "max_tokens": 6,
        "temperature": 0,
    });
    let (status, v) = tokio::task::spawn_blocking(move || {
        post_json(addr, "/v1/chat/completions", &body.to_string())
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["edgeprompt"]["cloud_prompt"]["source"], "local", "{v}");
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str(),
        Some(single.as_str())
    );
}
