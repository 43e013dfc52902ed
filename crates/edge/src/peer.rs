//! An edge serves the cloud prompts it holds (memory or disk) to peer edges over the cloud's
//! own gRPC service, by content address only; it never forwards a peer's request elsewhere.
//! Peers must carry the peer token (when set), are rate- and stream-limited like the cloud's
//! clients, and get what this edge holds exactly: f16 of the values the cloud signed, with the
//! cloud's signatures, so they can check it as if it came from the cloud.

use std::pin::Pin;
use std::sync::Arc;

use edgeprompt_cloud::guard::{Guard, Limits};
use edgeprompt_cloud::stream::{check_fingerprint, header, send_layer, LayerSeal, Layout};
use edgeprompt_kv::Codec;
use edgeprompt_protocol::cloud_kv_server::{CloudKv, CloudKvServer};
use edgeprompt_protocol::{FetchMessage, FetchRequest, ListReply, ListRequest, PromptRef};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::prefixes::Prefixes;

#[derive(Clone)]
pub struct PeerService {
    prefixes: Arc<Prefixes>,
    guard: Arc<Guard>,
    /// Serve only prompts whose every layer carries the cloud's signature.
    signed_only: bool,
}

/// Who may ask this edge, and what it serves.
#[derive(Debug, Clone, Default)]
pub struct PeerPolicy {
    /// The token peers must send (`Authorization: Bearer`); none: any peer that reaches the
    /// port (bind it to a private address).
    pub token: Option<String>,
    pub limits: Limits,
    pub signed_only: bool,
}

impl PeerService {
    pub fn new(prefixes: Arc<Prefixes>, policy: PeerPolicy) -> Self {
        Self {
            prefixes,
            guard: Arc::new(Guard::new(policy.limits, policy.token)),
            signed_only: policy.signed_only,
        }
    }

    pub fn server(prefixes: Arc<Prefixes>, policy: PeerPolicy) -> CloudKvServer<Self> {
        CloudKvServer::new(Self::new(prefixes, policy))
    }
}

type FetchStream = Pin<Box<dyn Stream<Item = Result<FetchMessage, Status>> + Send>>;

#[tonic::async_trait]
impl CloudKv for PeerService {
    type FetchStream = FetchStream;

    /// Peers serve by content address, not by name: they list nothing.
    async fn list(&self, _req: Request<ListRequest>) -> Result<Response<ListReply>, Status> {
        Err(Status::unimplemented("peers serve by content address only"))
    }

    async fn fetch(&self, req: Request<FetchRequest>) -> Result<Response<FetchStream>, Status> {
        let permit = self.guard.admit(&req)?;
        let req = req.into_inner();
        let model = self.prefixes.model().clone();
        check_fingerprint(&req, &model.fingerprint)?;
        let address = match &req.prompt {
            Some(PromptRef::ContentAddress(a)) => hex::encode(a),
            _ => {
                return Err(Status::invalid_argument(
                    "peers serve cloud prompts by content address only",
                ))
            }
        };
        if req.first_layer != 0 {
            return Err(Status::invalid_argument("peers serve whole prompts only"));
        }
        let layout = Layout::of(&model, &req)?;
        let (prefix, seal) = self
            .prefixes
            .cached(&address)
            .await
            .ok_or_else(|| Status::not_found("this edge holds no such cloud prompt"))?;
        // Relayed signatures must cover every layer, or none are sent.
        let seal = seal.filter(|s| s.first_layer == 0 && !s.mapped);
        if self.signed_only && seal.is_none() {
            return Err(Status::not_found(
                "this edge serves peers only KV its cloud signed",
            ));
        }
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            let _permit = permit;
            // f16 on the wire: the values exactly as held (and as signed).
            let (prompt_id, values) = match &seal {
                Some(s) => (s.prompt_id.as_str(), Some(s.codec)),
                None => ("", None),
            };
            let head = header(
                &layout,
                prompt_id,
                &address,
                &prefix.token_ids,
                Codec::F16,
                None,
                values,
            );
            let starts = layout.starts(prefix.token_ids.len());
            if tx.send(Ok(head)).await.is_err() {
                return;
            }
            for (l, layer) in prefix.layers.iter().enumerate() {
                let sig = seal
                    .as_ref()
                    .and_then(|s| s.signature_of(&prefix, l))
                    .map_or(LayerSeal::None, LayerSeal::Relay);
                if let Err(e) = send_layer(&tx, l, layer, starts[l], Codec::F16, None, sig).await {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
