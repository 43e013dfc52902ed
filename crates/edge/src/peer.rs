//! An edge serves the cloud prompts it holds (memory or disk) to peer edges over the cloud's
//! own gRPC service, by content address only; it never forwards a peer's request elsewhere.

use std::pin::Pin;
use std::sync::Arc;

use edgeprompt_cloud::stream::{check_fingerprint, header, negotiate, send_layer, Layout};
use edgeprompt_protocol::cloud_kv_server::{CloudKv, CloudKvServer};
use edgeprompt_protocol::{FetchMessage, FetchRequest, PromptRef};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::prefixes::Prefixes;

#[derive(Clone)]
pub struct PeerService(pub Arc<Prefixes>);

impl PeerService {
    pub fn server(prefixes: Arc<Prefixes>) -> CloudKvServer<Self> {
        CloudKvServer::new(Self(prefixes)).max_encoding_message_size(64 << 20)
    }
}

type FetchStream = Pin<Box<dyn Stream<Item = Result<FetchMessage, Status>> + Send>>;

#[tonic::async_trait]
impl CloudKv for PeerService {
    type FetchStream = FetchStream;

    async fn fetch(&self, req: Request<FetchRequest>) -> Result<Response<FetchStream>, Status> {
        let req = req.into_inner();
        let model = self.0.model().clone();
        check_fingerprint(&req, &model.fingerprint)?;
        let address = match &req.prompt {
            Some(PromptRef::ContentAddress(a)) => hex::encode(a),
            _ => {
                return Err(Status::invalid_argument(
                    "peers serve cloud prompts by content address only",
                ))
            }
        };
        let (codec, zstd) = negotiate(&req)?;
        let layout = Layout::of(&model, &req)?;
        let prefix = self
            .0
            .cached(&address)
            .await
            .ok_or_else(|| Status::not_found("this edge holds no such cloud prompt"))?;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            let head = header(&layout, "", &address, &prefix.token_ids, codec, zstd);
            let starts = layout.starts(prefix.token_ids.len());
            if tx.send(Ok(head)).await.is_err() {
                return;
            }
            for (l, layer) in prefix.layers.iter().enumerate().skip(layout.first_layer) {
                if let Err(e) = send_layer(&tx, l, layer, starts[l], codec, zstd).await {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
