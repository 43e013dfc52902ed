//! gRPC client: one `FetchRequest` up, a header and verified layers down.

use std::time::Instant;

use edgeprompt_cloud::MAX_LISTED;
use edgeprompt_engine::{LayerKv, Model};
use edgeprompt_kv::chunk::MAX_CHUNK_TOKENS;
use edgeprompt_kv::{
    content_address, Chunk, Codec, Expect, LayerMap, Manifest, Reassembler, TrustKey,
};
use edgeprompt_protocol::cloud_kv_client::CloudKvClient;
use edgeprompt_protocol::{fetch_message::Body, FetchRequest, ListRequest, PromptRef};
use tokio::sync::mpsc;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

use crate::{EdgeError, Result};

#[derive(Debug, Clone)]
pub struct CloudHeader {
    pub prompt_id: String,
    pub token_ids: Vec<u32>,
    pub n_layers: usize,
    /// The first layer the stream carries (CE-LSLM: the ones below are computed here).
    pub first_layer: usize,
    pub codec: String,
    pub content_address: String,
    /// Per layer, the first position the stream carries (sliding-window layers are cut).
    pub layer_starts: Vec<usize>,
    /// CE-LSLM: a larger cloud model's KV mapped to this model's (false: this model's own,
    /// exact).
    pub mapped: bool,
    /// CE-LSLM fuser: this model's own KV fused with a larger model's by the fuser with this
    /// SHA-256 (empty: not fused).
    pub fuser: String,
    /// What the cloud signs for each layer (the values are what `manifest.codec` decodes to).
    pub manifest: Manifest,
    /// The encoded sizes of this edge's request (all it sent) and of the header it got.
    pub request_bytes: usize,
    pub header_bytes: usize,
}

/// One layer of cloud KV, complete and verified, with when it arrived and its wire size.
pub struct LayerArrival {
    pub layer: usize,
    pub kv: LayerKv,
    pub at: Instant,
    pub wire_bytes: usize,
    /// The cloud's signature of the layer, if the stream carried one (checked when this
    /// client holds the cloud's key).
    pub seal: Option<[u8; 64]>,
}

/// How the edge reaches the cloud (or a peer): whom to trust for TLS, and the bearer token.
#[derive(Clone, Default)]
pub struct ClientSecurity {
    /// PEM of the CA that signed the cloud's certificate; with it the connection is TLS.
    pub ca_pem: Option<Vec<u8>>,
    /// The name the certificate must carry (default: the URL's host).
    pub domain: Option<String>,
    pub token: Option<String>,
}

impl std::fmt::Debug for ClientSecurity {
    // The token never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSecurity")
            .field("tls", &self.ca_pem.is_some())
            .field("domain", &self.domain)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

pub struct CloudClient {
    url: String,
    inner: CloudKvClient<Channel>,
    token: Option<String>,
    /// The cloud's public key: with it, every layer must carry the cloud's valid signature.
    trust: Option<TrustKey>,
    /// Longest wait from the request to the stream's header (or the list's reply).
    header_timeout: std::time::Duration,
    /// Take this model's KV fused with a larger cloud model's (CE-LSLM fuser).
    accept_fused: bool,
}

/// Longest wait for a connection (TCP, TLS and HTTP/2 handshakes together).
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a cloud may take to answer a request with a header or a list, by default.
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A prompt the cloud publishes: its id, token count and content address (hex) for the model
/// that asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub id: String,
    pub tokens: usize,
    pub address: String,
}

/// The cloud's list: what it publishes, the key it signs with (none: unsigned) and its
/// signature of the list, not yet checked.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub prompts: Vec<Listed>,
    pub key: Option<TrustKey>,
    /// What the signature covers: every entry as sent.
    pub entries: Vec<edgeprompt_kv::ListEntry>,
    pub signature: Vec<u8>,
    /// When the cloud issued it and for how long it may be taken (none: the cloud sent no
    /// time), covered by `fresh_signature`.
    pub issued: Option<edgeprompt_kv::Issued>,
    pub fresh_signature: Vec<u8>,
    /// Where the cloud says its published prompts' objects are, and its signature of that.
    pub store_url: String,
    pub store_signature: Vec<u8>,
}

impl Listing {
    /// The prompts, if `key` signed this list for `fingerprint` with its issue time (any list
    /// when `key` is none: unsigned KV allowed). A signed list without a signed issue time
    /// is refused: an old one could be replayed for ever.
    pub fn signed_by(&self, key: Option<&TrustKey>, fingerprint: &str) -> Result<&[Listed]> {
        if let Some(k) = key {
            let at = self.issued.ok_or_else(|| {
                EdgeError::Stream(
                    "the cloud's list carries no issue time (a cloud too old to sign one?), \
                     so a replayed old list could not be told from it"
                        .into(),
                )
            })?;
            k.verify_list_fresh(fingerprint, &self.entries, at, &self.fresh_signature)?;
        }
        Ok(&self.prompts)
    }

    /// The store this list names, if `key` signed it for `fingerprint` at the list's issue
    /// time. None without a key: a store named by an unsigned list could be anyone's, and an
    /// edge never needs one (it falls back to the cloud).
    pub fn store(&self, key: Option<&TrustKey>, fingerprint: &str) -> Option<&str> {
        if self.store_url.is_empty() {
            return None;
        }
        let (k, at) = (key?, self.issued?);
        match k.verify_store(
            fingerprint,
            &self.store_url,
            at.unix_ms,
            &self.store_signature,
        ) {
            Ok(()) => Some(&self.store_url),
            Err(e) => {
                tracing::warn!("the cloud's list names a store ({}): {e}", self.store_url);
                None
            }
        }
    }
}

/// The longest store URL a list may name.
const MAX_STORE_URL: usize = 2048;

/// Whether credentials may go to `url` unencrypted: only to this machine.
pub fn plaintext_ok(url: &str) -> bool {
    let Ok(uri) = url.parse::<tonic::codegen::http::Uri>() else {
        return false;
    };
    if uri.scheme_str() == Some("https") {
        return true;
    }
    match uri.host() {
        Some("localhost") => true,
        Some(h) => h
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    }
}

impl CloudClient {
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, &ClientSecurity::default()).await
    }

    pub async fn connect_with(url: &str, sec: &ClientSecurity) -> Result<Self> {
        let err = |e: String| EdgeError::Connect {
            url: url.to_string(),
            msg: e,
        };
        let tls = sec.ca_pem.is_some() && url.starts_with("https://");
        if sec.token.is_some() && !tls && !plaintext_ok(url) {
            return Err(EdgeError::Config(format!(
                "refusing to send a bearer token to {url} unencrypted: use https:// with a CA (only loopback may go plain)"
            )));
        }
        // A cloud that does not answer a connection in 5 s counts as down (the edge then
        // computes the prompt itself) rather than holding the request.
        let mut ep = Channel::from_shared(url.to_string())
            .map_err(|e| err(e.to_string()))?
            .connect_timeout(std::time::Duration::from_secs(5));
        if let Some(ca) = &sec.ca_pem {
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
            if let Some(d) = &sec.domain {
                tls = tls.domain_name(d.clone());
            }
            ep = ep.tls_config(tls).map_err(|e| err(e.to_string()))?;
        }
        // The TCP connect has its own timeout; a peer that accepts and then stalls the TLS or
        // HTTP/2 handshake is bounded here.
        let ch = tokio::time::timeout(CONNECT_TIMEOUT, ep.connect())
            .await
            .map_err(|_| err(format!("no connection within {CONNECT_TIMEOUT:?}")))?
            .map_err(|e| err(format!("{e:?}")))?;
        Ok(Self {
            url: url.to_string(),
            inner: CloudKvClient::new(ch),
            token: sec.token.clone(),
            trust: None,
            header_timeout: HEADER_TIMEOUT,
            accept_fused: false,
        })
    }

    /// Give up on a request whose header (or list) has not come within `t`.
    /// Ask for fused KV where the cloud has a fuser for this model (CE-LSLM fuser).
    pub fn accepting_fused(mut self, fused: bool) -> Self {
        self.accept_fused = fused;
        self
    }

    pub fn header_timeout(mut self, t: std::time::Duration) -> Self {
        self.header_timeout = t;
        self
    }

    /// Take only KV that `key` signed, layer by layer.
    pub fn trusting(mut self, key: Option<TrustKey>) -> Self {
        self.trust = key;
        self
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// What the cloud publishes to `model`: ids checked like a fetch's, addresses of 32
    /// bytes, at most `MAX_LISTED`, and its signing key.
    pub async fn list(&mut self, model: &Model) -> Result<Listing> {
        let mut req = tonic::Request::new(ListRequest {
            model_fingerprint: model.fingerprint.clone(),
        });
        self.authorize(&mut req)?;
        let mut inner = self.inner.clone().max_decoding_message_size(256 << 10);
        let reply = tokio::time::timeout(self.header_timeout, inner.list(req))
            .await
            .map_err(|_| {
                EdgeError::Stream(format!(
                    "the cloud did not list its prompts within {:?}",
                    self.header_timeout
                ))
            })?
            .map_err(refused)?
            .into_inner();
        let key = match reply.signing_key.as_slice() {
            [] => None,
            b => Some(TrustKey::from_bytes(b)?),
        };
        let entries = edgeprompt_cloud::list_entries(&reply.prompts);
        let prompts = reply
            .prompts
            .into_iter()
            .filter(|p| {
                edgeprompt_protocol::valid_prompt_id(&p.id) && p.content_address.len() == 32
            })
            .take(MAX_LISTED)
            .map(|p| Listed {
                id: p.id,
                tokens: p.tokens as usize,
                address: hex::encode(&p.content_address),
            })
            .collect();
        let issued = (reply.issued_unix_ms > 0).then_some(edgeprompt_kv::Issued {
            unix_ms: reply.issued_unix_ms,
            max_age_secs: reply.max_age_secs,
        });
        // A URL no store needs more of than this is not taken.
        let store_url = match reply.store_url.len() {
            0..=MAX_STORE_URL => reply.store_url,
            _ => String::new(),
        };
        Ok(Listing {
            prompts,
            key,
            entries,
            signature: reply.signature,
            issued,
            fresh_signature: reply.fresh_signature,
            store_url,
            store_signature: reply.store_signature,
        })
    }

    fn authorize<T>(&self, req: &mut tonic::Request<T>) -> Result<()> {
        if let Some(t) = &self.token {
            let v = format!("Bearer {t}")
                .parse()
                .map_err(|_| EdgeError::Refused("the token is not a valid header value".into()))?;
            req.metadata_mut().insert("authorization", v);
        }
        Ok(())
    }

    /// Ask for a cloud prompt's KV. Returns the header and a channel of layers in order; a
    /// chunk that fails its checksum, comes out of order or does not fit the model ends the
    /// stream with an error, and nothing of it is used.
    pub async fn fetch(
        &mut self,
        model: &Model,
        prompt: PromptRef,
        codecs: &[Codec],
        zstd: bool,
    ) -> Result<(CloudHeader, mpsc::Receiver<Result<LayerArrival>>)> {
        self.fetch_from(model, prompt, codecs, zstd, 0).await
    }

    /// `fetch` for the layers from `first_layer` on only (CE-LSLM: a cloud with adapters for
    /// this model maps its own KV to this model's for those layers).
    pub async fn fetch_from(
        &mut self,
        model: &Model,
        prompt: PromptRef,
        codecs: &[Codec],
        zstd: bool,
        first_layer: usize,
    ) -> Result<(CloudHeader, mpsc::Receiver<Result<LayerArrival>>)> {
        let asked = prompt.clone();
        let req = FetchRequest {
            prompt: Some(prompt),
            model_fingerprint: model.fingerprint.clone(),
            accept_codecs: codecs.iter().map(|c| c.name().to_string()).collect(),
            accept_zstd: zstd,
            first_layer: first_layer as u32,
            accept_fused: self.accept_fused,
        };
        let request_bytes = prost::Message::encoded_len(&req);
        let mut req = tonic::Request::new(req);
        self.authorize(&mut req)?;
        // No message may be larger than the largest a valid stream for this model holds: a
        // header of a context's worth of ids, or one chunk of f16.
        let cfg = &model.cfg;
        let state = cfg.features.recurrence.map_or(0, |s| s.state_bytes());
        let most = (cfg.context_length * 5)
            .max(Codec::F16.chunk_bytes(
                cfg.n_kv_head,
                cfg.head_dim.max(cfg.head_dim_local),
                MAX_CHUNK_TOKENS,
            ))
            .max(state)
            + (64 << 10);
        let mut inner = self.inner.clone().max_decoding_message_size(most);
        // A cloud that accepts the request and then says nothing holds no one: the header
        // must come within the deadline.
        let opened = async {
            let mut stream = inner.fetch(req).await.map_err(refused)?.into_inner();
            let first = stream
                .message()
                .await
                .map_err(refused)?
                .ok_or_else(|| EdgeError::Stream("stream ended before the header".into()))?;
            Ok::<_, EdgeError>((stream, first))
        };
        let (mut stream, first) = tokio::time::timeout(self.header_timeout, opened)
            .await
            .map_err(|_| {
                EdgeError::Stream(format!(
                    "no header within {:?} of the request",
                    self.header_timeout
                ))
            })??;
        let header_bytes = prost::Message::encoded_len(&first);
        let h = match first.body {
            Some(Body::Header(h)) => h,
            _ => return Err(EdgeError::Stream("first message is not a header".into())),
        };
        let header = CloudHeader {
            request_bytes,
            header_bytes,
            ..check_header(model, &asked, first_layer, h)?
        };
        let manifest = header.manifest.clone();
        let trust = self.trust;
        let (tx, rx) = mpsc::channel(cfg.n_layer.max(1));
        let wire_codec = Codec::parse(&header.codec)
            .filter(|c| codecs.is_empty() || codecs.contains(c))
            .ok_or_else(|| {
                EdgeError::Stream(format!(
                    "the stream is in {:?}, not a codec this edge asked for",
                    header.codec
                ))
            })?;
        let mut re = Reassembler::new(
            cfg.n_layer,
            header.token_ids.len(),
            cfg.n_kv_head,
            cfg.head_dim,
        )
        .with_codec(wire_codec)
        .with_state(cfg.features.recurrence)
        .with_layers(LayerMap::of(cfg))?
        .with_starts(&header.layer_starts)?
        .starting_at(first_layer);
        tokio::spawn(async move {
            let mut bytes = 0;
            // Layers that read another's KV come with no chunk: complete when due, unsigned
            // (they hold nothing; the header and every seal name them).
            let unowned = |re: &mut Reassembler| {
                re.take_unowned()
                    .into_iter()
                    .map(|(layer, kv)| LayerArrival {
                        layer,
                        kv,
                        at: Instant::now(),
                        wire_bytes: 0,
                        seal: None,
                    })
            };
            for a in unowned(&mut re) {
                if tx.send(Ok(a)).await.is_err() {
                    return;
                }
            }
            loop {
                // Whoever reads the layers let go (the fetch ended or was stopped): close the
                // stream rather than wait on a sender that may never send again.
                let next = tokio::select! {
                    m = stream.message() => m,
                    _ = tx.closed() => return,
                };
                let msg = match next {
                    Ok(Some(m)) => m,
                    Ok(None) if re.is_complete() => return,
                    Ok(None) => {
                        let _ = tx
                            .send(Err(EdgeError::Stream(format!(
                                "stream ended after {} of {} layers",
                                re.layers_done(),
                                re_layers(&re)
                            ))))
                            .await;
                        return;
                    }
                    Err(s) => {
                        let _ = tx
                            .send(Err(EdgeError::Stream(format!(
                                "{:?}: {}",
                                s.code(),
                                s.message()
                            ))))
                            .await;
                        return;
                    }
                };
                let chunk = match msg.body {
                    Some(Body::Chunk(c)) => c,
                    _ => {
                        let _ = tx
                            .send(Err(EdgeError::Stream(
                                "unexpected message after the header".into(),
                            )))
                            .await;
                        return;
                    }
                };
                bytes += chunk.payload.len() + chunk.state.len();
                let sig = <[u8; 64]>::try_from(chunk.layer_seal.as_slice()).ok();
                let result = Chunk::try_from(chunk)
                    .map_err(EdgeError::Stream)
                    .and_then(|c| re.push(&c).map_err(EdgeError::from))
                    .and_then(|done| match (done, trust) {
                        // A layer is checked the moment it is complete, before anyone uses it.
                        (Some((l, kv)), Some(key)) => {
                            let sig = sig.ok_or_else(|| {
                                EdgeError::Stream(format!(
                                    "layer {l} is unsigned; this edge takes only KV its cloud signed"
                                ))
                            })?;
                            key.verify_layer(&manifest, l, &kv, &sig)?;
                            Ok(Some((l, kv)))
                        }
                        (done, _) => Ok(done),
                    });
                match result {
                    Ok(Some((layer, kv))) => {
                        let a = LayerArrival {
                            layer,
                            kv,
                            at: Instant::now(),
                            wire_bytes: std::mem::take(&mut bytes),
                            seal: sig,
                        };
                        if tx.send(Ok(a)).await.is_err() {
                            return;
                        }
                        for a in unowned(&mut re) {
                            if tx.send(Ok(a)).await.is_err() {
                                return;
                            }
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
        });
        Ok((header, rx))
    }
}

/// The checks a stream's header must pass before anything it claims is used: this model's
/// fingerprint and shape, the layer asked for, ids within the context and vocabulary, the
/// prompt asked for (by address: its ids hash to it; by id: that id), windows no later than
/// they may be cut. Returns what the stream is, and what its layers' signatures must cover.
pub fn check_header(
    model: &Model,
    asked: &PromptRef,
    first_layer: usize,
    h: edgeprompt_protocol::Header,
) -> Result<CloudHeader> {
    let cfg = &model.cfg;
    // Head sizes per layer and the layers reading another's KV are the model's, exactly: a
    // header may neither claim KV for a layer that owns none nor omit a layer's own.
    let layers = LayerMap::of(cfg);
    let as_usize = |v: &[u32]| v.iter().map(|&x| x as usize).collect::<Vec<_>>();
    if h.model_fingerprint != model.fingerprint
        || h.n_layers as usize != cfg.n_layer
        || h.n_kv_head as usize != cfg.n_kv_head
        || h.head_dim as usize != cfg.head_dim
        || h.first_layer as usize != first_layer
        || as_usize(&h.head_dims) != layers.head_dims
        || as_usize(&h.kv_sources) != layers.kv_sources
    {
        return Err(EdgeError::Stream(format!(
            "header does not fit this model: {} layers x {} heads x {} (per layer {:?}, KV of \
             {:?}) from layer {}",
            h.n_layers, h.n_kv_head, h.head_dim, h.head_dims, h.kv_sources, h.first_layer
        )));
    }
    Expect::of(cfg)
        .check_ids(&h.token_ids)
        .map_err(|e| EdgeError::Stream(format!("header: {e}")))?;
    // It must be the prompt asked for: by address, the one its ids hash to; by id, that id.
    let address = content_address(&h.model_fingerprint, &h.token_ids);
    let asked = match asked {
        PromptRef::ContentAddress(a) => hex::encode(a) == address,
        PromptRef::Id(id) => *id == h.prompt_id,
    };
    if !asked || hex::encode(&h.content_address) != address {
        return Err(EdgeError::Stream(format!(
            "the header names another prompt than the one asked for ({:?}, address {})",
            h.prompt_id,
            &address[..12]
        )));
    }
    let values_codec = match h.values_codec.as_str() {
        "" => &h.codec,
        c => c,
    };
    let values_codec = Codec::parse(values_codec)
        .ok_or_else(|| EdgeError::Stream(format!("unknown codec {values_codec:?}")))?;
    // A hybrid model's recurrent layers and their state's shape are the model's own.
    let want = edgeprompt_protocol::state_shape(&cfg.recurrent, cfg.features.recurrence);
    if h.state_shape != want {
        return Err(EdgeError::Stream(format!(
            "header's recurrent state {:?} is not this model's {want:?}",
            h.state_shape
        )));
    }
    // A cut must leave every position a private token can see: no later than the window. A
    // recurrent layer holds none: it starts at the prompt's end exactly.
    let n = h.token_ids.len();
    let starts: Vec<usize> = h.layer_starts.iter().map(|&s| s as usize).collect();
    let holds_none = |l: usize| !cfg.owns_kv(l);
    let cut = (0..cfg.n_layer).any(holds_none) && n > 0;
    if (cut && starts.is_empty())
        || !starts.is_empty()
            && (starts.len() != cfg.n_layer
                || starts
                    .iter()
                    .enumerate()
                    .any(|(l, &s)| s > cfg.visible_from(l, n) || (holds_none(l) && s != n)))
    {
        return Err(EdgeError::Stream(format!(
            "header's layer starts {starts:?} for {n} tokens: a layer cut past its window, or a \
             recurrent layer not at the prompt's end"
        )));
    }
    let manifest = Manifest {
        prompt_id: h.prompt_id.clone(),
        fingerprint: h.model_fingerprint.clone(),
        address: address.clone(),
        n_layers: cfg.n_layer,
        n_kv_head: cfg.n_kv_head,
        head_dim: cfg.head_dim,
        first_layer,
        codec: values_codec,
        mapped: h.mapped,
        layers,
        fuser: h.fuser.clone(),
    };
    let header = CloudHeader {
        prompt_id: h.prompt_id,
        token_ids: h.token_ids,
        n_layers: cfg.n_layer,
        first_layer,
        codec: h.codec,
        content_address: address,
        layer_starts: starts,
        mapped: h.mapped,
        fuser: h.fuser,
        manifest,
        request_bytes: 0,
        header_bytes: 0,
    };
    Ok(header)
}

fn refused(s: tonic::Status) -> EdgeError {
    match s.code() {
        tonic::Code::NotFound => EdgeError::NotFound(s.message().to_string()),
        c => EdgeError::Refused(format!("{c:?}: {}", s.message())),
    }
}

fn re_layers(re: &Reassembler) -> String {
    if re.is_complete() {
        "all".into()
    } else {
        "the expected".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgeprompt_kv::{Issued, SealKey};

    /// A list's store is taken only with the trusted key's signature of that URL, for this
    /// model, at the list's issue time.
    #[test]
    fn a_listed_store_is_taken_only_as_signed() {
        let key = SealKey::from_seed([3; 32]);
        let at = Issued {
            unix_ms: 1_700_000_000_000,
            max_age_secs: 300,
        };
        let url = "https://cdn.example/edgeprompt";
        let listing = |store_url: &str, sig: Vec<u8>| Listing {
            issued: Some(at),
            store_url: store_url.into(),
            store_signature: sig,
            ..Default::default()
        };
        let signed = key.sign_store("fp", url, at.unix_ms).to_vec();
        let trusted = key.public();
        assert_eq!(
            listing(url, signed.clone()).store(Some(&trusted), "fp"),
            Some(url)
        );
        let other = SealKey::from_seed([4; 32]).public();
        for (what, l, k, fp) in [
            (
                "another URL",
                listing("https://evil.example/kv", signed.clone()),
                Some(&trusted),
                "fp",
            ),
            (
                "another key",
                listing(url, signed.clone()),
                Some(&other),
                "fp",
            ),
            (
                "another model",
                listing(url, signed.clone()),
                Some(&trusted),
                "fp2",
            ),
            (
                "no key (unsigned KV allowed)",
                listing(url, signed.clone()),
                None,
                "fp",
            ),
            (
                "no signature",
                listing(url, Vec::new()),
                Some(&trusted),
                "fp",
            ),
        ] {
            assert_eq!(l.store(k, fp), None, "{what}");
        }
        let undated = Listing {
            issued: None,
            ..listing(url, signed)
        };
        assert_eq!(undated.store(Some(&trusted), "fp"), None, "no issue time");
        assert_eq!(listing("", Vec::new()).store(Some(&trusted), "fp"), None);
    }
}
