//! Getting a published prompt's KV from the cloud or a peer, layer by layer under its
//! deadlines and the prompt cache's budget, and computing a prompt here.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use edgeprompt_engine::{Model, PrefixKv, Sequence};
use edgeprompt_kv::{Codec, Seal};
use edgeprompt_protocol::PromptRef;

use super::{LookupError, Prefixes, Slot};
use crate::layer_stream::{LayerStream, Wire};
use crate::{CloudClient, EdgeError};

impl Prefixes {
    /// From the first of `urls` that answers (a peer, or the cloud's replicas in this
    /// prompt's order); a replica that fails mid-stream is followed by the next, whose stream
    /// must be the same bits.
    pub(super) async fn fetch(
        &self,
        urls: &[String],
        prompt: PromptRef,
        ids: Option<&[u32]>,
        slot: Option<&Arc<Slot>>,
        first: usize,
    ) -> Result<(PrefixKv, Option<Seal>, Wire), EdgeError> {
        let Some(url) = urls.first() else {
            return Err(EdgeError::Stream("nowhere to fetch from".into()));
        };
        let to_cloud = self.is_cloud(url);
        let auto = self.cfg.auto_codec.as_ref().filter(|_| to_cloud);
        let codec = match auto {
            // A peer relays what it holds, as f16.
            _ if !to_cloud => Codec::F16,
            Some(a) => {
                let c = a.choose(ids.map(<[u32]>::len), self.model.cfg.kv_bytes_per_token());
                tracing::info!(codec = c.codec.name(), "codec auto: {}", c.reason);
                self.metrics
                    .codec_choices
                    .get_or_create(&crate::metrics::CodecLabels {
                        codec: c.codec.name().into(),
                    })
                    .inc();
                c.codec
            }
            None => self.cfg.codec,
        };
        // The key every layer must be signed by, whoever relays it: none only when unsigned
        // KV is allowed; a cloud whose key is not known (or changed) is not asked at all.
        let trust = self
            .catalog
            .key()
            .await
            .map_err(|e| EdgeError::Refused(e.to_string()))?;
        // The prompt's bytes held against the cache's budget before anything is asked, when
        // its length is known (its tokens, or the cloud's list): a refusal then sends nothing,
        // so whether a fetch goes out never depends on what is being computed here.
        let cfg = &self.model.cfg;
        let listed = ids.map(<[u32]>::len).or_else(|| {
            let p = self.catalog.current();
            match &prompt {
                PromptRef::Id(id) => p.named(id).map(|l| l.tokens),
                PromptRef::ContentAddress(a) => p.at(&hex::encode(a)).map(|l| l.tokens),
            }
        });
        let mut held = match listed {
            Some(n) => Some(self.hold(cfg.prompt_bytes(n), false).map_err(busy)?),
            None => None,
        };
        let asked = Instant::now();
        // The cloud's token goes to the cloud only; peers get the peer token.
        let security = match to_cloud {
            true => &self.cfg.security,
            false => &self.cfg.peer_security,
        };
        let link = self.meter.link();
        let deadlines = self.cfg.deadlines;
        // A header takes a round trip: a slow link gets longer than the floor.
        let header_deadline = deadlines
            .header
            .max(link.map_or(Duration::ZERO, |l| l.rtt * 20));
        let wire_codec = match to_cloud {
            true => codec,
            false => Codec::F16,
        };
        let open = |url: String| {
            let prompt = prompt.clone();
            async move {
                let mut client = CloudClient::connect_with(&url, security)
                    .await?
                    .trusting(trust)
                    .header_timeout(header_deadline)
                    .accepting_fused(to_cloud && self.cfg.fused);
                let (header, rx) = client
                    .fetch_from(&self.model, prompt, &[codec], false, first)
                    .await
                    .inspect_err(|e| tracing::warn!("fetch from {url}: {e}"))?;
                self.check_stream(&header, to_cloud, wire_codec, codec, ids)?;
                Ok::<_, EdgeError>((header, rx))
            }
        };
        let mut tried = 0;
        let (header, mut rx) = loop {
            match open(urls[tried].clone()).await {
                Ok(got) => break got,
                Err(e) if tried + 1 < urls.len() => {
                    tracing::warn!(
                        "fetch from {}: {e}; asking {}",
                        urls[tried],
                        urls[tried + 1]
                    );
                    tried += 1;
                }
                Err(e) => return Err(e),
            }
        };
        let header_at = Instant::now();
        let opened = Wire {
            up: header.request_bytes,
            down: header.header_bytes,
        };
        let mut received = 0;
        // The link is timed from the first layer's arrival to the last's, over the bytes
        // after the first: the header shares its first packets (or a shaper's first buffer)
        // with the first layer, so timing from the header overstates a small fetch's rate.
        let mut wire: Option<(Instant, usize, Instant)> = None;
        // What arrives counts against the prompt cache's budget while it arrives, like a
        // prompt computed here: a flood of fetches is refused, not held in memory unbounded.
        let bytes = cfg.prompt_bytes(header.token_ids.len());
        if held.as_ref().is_none_or(|h| h.bytes < bytes) {
            held = Some(self.hold(bytes, false).map_err(busy)?);
        }
        // Shared with the shallow layers computed here: given back when both are done,
        // however the fetch ends.
        let held = Arc::new(held);
        // However the sender paces it, the whole fetch ends in time: the floor, or four times
        // what the measured link needs for this many bytes.
        let whole = deadlines.whole.max(link.map_or(Duration::ZERO, |l| {
            Duration::from_secs_f64(4.0 * bytes as f64 / l.bytes_per_sec.max(1.0))
        }));
        let until = tokio::time::Instant::from_std(asked) + whole;
        // Requests waiting on this prompt follow its layers from here on.
        let stream = slot.map(|slot| {
            let s = Arc::new(
                LayerStream::new(header.token_ids.clone(), self.model.cfg.n_layer)
                    .opened_with(opened),
            );
            slot.send_replace(Some(s.clone()));
            s
        });
        // CE-LSLM: the shallow layers computed here while the deep ones arrive.
        let (model, ids) = (self.model.clone(), header.token_ids.clone());
        let (to, computing) = (stream.clone(), held.clone());
        let shallow = tokio::task::spawn_blocking(move || {
            let _held = computing;
            shallow_layers(&model, &ids, first, to.as_deref())
        });
        let mut deep: Vec<Arc<edgeprompt_engine::LayerKv>> = Vec::with_capacity(header.n_layers);
        let mut signatures = Vec::with_capacity(header.n_layers);
        let mut l = first;
        while l < header.n_layers {
            let a = match next_layer(&mut rx, l, deadlines.layer, until, whole).await {
                Ok(a) => a,
                // The next replica streams the same prompt: its layers up to here must be
                // the bits already taken; the stream goes on from there.
                Err(e) if tried + 1 < urls.len() => {
                    tried += 1;
                    let (from, to) = (&urls[tried - 1], &urls[tried]);
                    tracing::warn!("fetch from {from}: {e} at layer {l}; resuming from {to}");
                    let resumed = async {
                        let (again, mut more) = open(to.clone()).await?;
                        if again.token_ids != header.token_ids || again.manifest != header.manifest
                        {
                            return Err(EdgeError::Stream(format!(
                                "{to} streams another prompt than {from}"
                            )));
                        }
                        let mut replayed = 0;
                        for (i, had) in deep.iter().enumerate() {
                            let a = next_layer(&mut more, first + i, deadlines.layer, until, whole)
                                .await?;
                            replayed += a.wire_bytes;
                            if a.kv != **had {
                                return Err(EdgeError::Stream(format!(
                                    "{to} sent other values for layer {} than {from}",
                                    first + i
                                )));
                            }
                        }
                        Ok((more, replayed))
                    };
                    match resumed.await {
                        Ok((more, replayed)) => {
                            self.metrics.cloud_bytes.inc_by(replayed as u64);
                            received += replayed;
                            rx = more;
                        }
                        // On to the replica after it (a closed stream fails at once).
                        Err(e) => {
                            tracing::warn!("resuming from {to}: {e}");
                            rx = tokio::sync::mpsc::channel(1).1;
                        }
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!("fetch from {}: {e}; falling back", urls[tried]);
                    return Err(e);
                }
            };
            self.metrics.cloud_bytes.inc_by(a.wire_bytes as u64);
            received += a.wire_bytes;
            wire = Some(match wire {
                None => (a.at, 0, a.at),
                Some((first, bytes, _)) => (first, bytes + a.wire_bytes, a.at),
            });
            if deep.is_empty() {
                // The first layer is in (and, with the cloud's key, verified): now what the
                // header says of the cloud (mapped or exact) can be learnt, and its ids vouched.
                if let (Some(a), true) = (&self.cfg.auto_split, to_cloud) {
                    a.learn(header.mapped);
                }
                if let Some(s) = &stream {
                    s.vouch();
                }
            }
            let kv = Arc::new(a.kv);
            if let Some(s) = &stream {
                s.put(a.layer, kv.clone(), a.wire_bytes);
            }
            // A layer that reads another's KV holds none: no seal is its to carry.
            if kv.kv_of.is_none() {
                signatures.push(a.seal);
            }
            deep.push(kv);
            l += 1;
        }
        // Kept (and relayed) when every layer streamed was signed. Fused KV is verified layer
        // by layer as it arrives and kept in memory only: the seal at rest names no fuser.
        let seal = signatures
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .map(|signatures| Seal {
                prompt_id: header.manifest.prompt_id.clone(),
                codec: header.manifest.codec,
                first_layer: first,
                mapped: header.mapped,
                signatures,
            })
            .filter(|_| header.fuser.is_empty());
        let (bytes, secs) = wire.map_or((0, 0.0), |(first, bytes, last)| {
            (bytes, last.saturating_duration_since(first).as_secs_f64())
        });
        if to_cloud {
            self.meter.observe(header_at - asked, bytes, secs);
        }
        if let Some(s) = &self.cfg.auto_split {
            s.observe(header_at - asked, bytes, secs);
        }
        if let Some(a) = auto {
            a.observe(header_at - asked, bytes, secs);
            if let Some(l) = a.link() {
                self.metrics
                    .link_bytes_per_second
                    .set(l.bytes_per_sec as i64);
            }
        }
        let mut layers = shallow
            .await
            .map_err(|e| EdgeError::Stream(e.to_string()))?
            .map_err(|e| EdgeError::Stream(e.to_string()))?;
        layers.extend(deep);
        let whole = PrefixKv {
            fingerprint: self.model.fingerprint.clone(),
            token_ids: header.token_ids,
            layers,
        };
        // The layers computed here cut like the cloud's: the same prefix as a whole fetch.
        let prefix = whole.window_cut(&self.model.cfg);
        // A cloud that sent more of a sliding layer than a later token sees (allowed) signed
        // values this prefix no longer holds: used, but not kept or relayed as signed.
        let trimmed = (first..prefix.layers.len())
            .any(|l| prefix.layers[l].start() != whole.layers[l].start());
        let seal = seal.filter(|_| !trimmed);
        let wire = Wire {
            up: opened.up,
            down: opened.down + received,
        };
        Ok((prefix, seal, wire))
    }

    /// Reserve `bytes` of the prompt cache's budget for a prompt arriving or being computed
    /// (`local`: computed here, which is also bounded in number); given back when the guard
    /// drops, however the work ends (the guard goes with the work, not the request).
    pub(super) fn hold(&self, bytes: usize, local: bool) -> Result<Held, LookupError> {
        if bytes > self.cfg.cache_bytes {
            return Err(LookupError::TooLong(format!(
                "the cloud prompt's KV ({} MB) is larger than this edge's prompt cache ({} MB)",
                bytes >> 20,
                self.cfg.cache_bytes >> 20
            )));
        }
        let mut l = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if local && l.1 >= self.cfg.max_local_prefills.max(1) {
            return Err(LookupError::Busy(format!(
                "{} system prompts are being computed on this edge; retry later",
                l.1
            )));
        }
        if l.0 + bytes > self.cfg.cache_bytes {
            return Err(LookupError::Busy(format!(
                "{} MB of prompt KV are arriving or being computed on this edge; retry later",
                l.0 >> 20
            )));
        }
        *l = (l.0 + bytes, l.1 + local as usize);
        Ok(Held {
            pending: self.pending.clone(),
            bytes,
            local,
        })
    }

    /// Prefill a prompt here: at most `max_local_prefills` at once, and no more prompt bytes
    /// at once than the memory budget holds (a flood of new system prompts is refused, not
    /// queued without bound).
    pub(super) async fn compute(&self, ids: &[u32]) -> Result<PrefixKv, LookupError> {
        let bytes = self.model.cfg.prompt_bytes(ids.len());
        if bytes > self.cfg.cache_bytes {
            return Err(LookupError::TooLong(format!(
                "the system prompt's KV ({} MB for {} tokens) is larger than this edge's prompt cache ({} MB)",
                bytes >> 20,
                ids.len(),
                self.cfg.cache_bytes >> 20
            )));
        }
        let held = self.hold(bytes, true)?;
        let (model, ids) = (self.model.clone(), ids.to_vec());
        tokio::task::spawn_blocking(move || {
            // Held by the computation itself: a request that goes away does not free the
            // slot while the prefill still runs.
            let _held = held;
            let mut seq = Sequence::new(&model);
            seq.prefill_chunked(&model, &ids, 256)?;
            // Kept as the cloud would send it: sliding-window layers cut.
            Ok::<_, edgeprompt_engine::EngineError>(
                seq.export_prefix(&model)?.window_cut(&model.cfg),
            )
        })
        .await
        .map_err(|e| LookupError::Failed(e.to_string()))?
        .map_err(|e| LookupError::Failed(e.to_string()))
    }
}

/// A refused reservation as a fetch error (a prompt too large for the cache stays that).
fn busy(e: LookupError) -> EdgeError {
    match e {
        LookupError::TooLong(m) => EdgeError::TooLong(m),
        e => EdgeError::Busy(e.to_string()),
    }
}

/// Prompt-cache bytes reserved for work in flight, given back on drop.
pub(super) struct Held {
    pending: Arc<Mutex<(usize, usize)>>,
    bytes: usize,
    local: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut l = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        *l = (l.0 - self.bytes, l.1 - self.local as usize);
    }
}

/// Layers `0..n` of the prompt `ids`, computed here (CE-LSLM's shallow layers), each put on
/// `stream` as it is done.
fn shallow_layers(
    model: &Model,
    ids: &[u32],
    n: usize,
    stream: Option<&LayerStream>,
) -> edgeprompt_engine::Result<Vec<Arc<edgeprompt_engine::LayerKv>>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut pass = edgeprompt_engine::sequence::PrefillPass::new(model, ids, 0)?;
    let mut layers = Vec::with_capacity(n);
    for l in 0..n {
        pass.run_layer(model, None)?;
        let kv = Arc::new(pass.layer_kv(l).clone());
        if let Some(s) = stream {
            s.put(l, kv.clone(), 0);
        }
        layers.push(kv);
    }
    Ok(layers)
}

impl Prefixes {
    /// What a stream's header must be before any of its layers is taken: the codec asked for
    /// (a peer relays f16 of a codec this edge takes), the prompt's tokens as this edge reads
    /// them, and exact KV where exact KV is expected.
    fn check_stream(
        &self,
        header: &crate::client::CloudHeader,
        to_cloud: bool,
        wire_codec: Codec,
        codec: Codec,
        ids: Option<&[u32]>,
    ) -> Result<(), EdgeError> {
        if header.codec != wire_codec.name() {
            return Err(EdgeError::Stream(format!(
                "the stream is in {}; this edge asked for {}",
                header.codec,
                wire_codec.name()
            )));
        }
        if to_cloud && header.manifest.codec != codec {
            return Err(EdgeError::Stream(format!(
                "the cloud sent {} KV; this edge asked for {}",
                header.manifest.codec.name(),
                codec.name()
            )));
        }
        if !to_cloud && !self.takes_codec(header.manifest.codec) {
            return Err(EdgeError::Stream(format!(
                "the peer holds KV decoded from {}, which this edge does not take",
                header.manifest.codec.name()
            )));
        }
        if ids.is_some_and(|ids| ids != header.token_ids.as_slice()) {
            return Err(EdgeError::Stream(
                "the cloud's prompt tokens differ from this edge's tokenization".into(),
            ));
        }
        // Fused KV only where this edge asked for it, and only from its cloud.
        let asked_fused = to_cloud && self.cfg.fused;
        if !header.fuser.is_empty() && !asked_fused {
            return Err(EdgeError::Stream(
                "the cloud sent fused KV (CE-LSLM fuser); this edge did not ask for it".into(),
            ));
        }
        // Mapped KV must never be kept where exact KV is expected (and served to peers).
        if header.mapped && !self.lslm() {
            return Err(EdgeError::Stream(
                "the cloud sent a larger model's KV mapped through adapters (CE-LSLM); this edge asked for its own model's exact KV".into(),
            ));
        }
        Ok(())
    }
}

/// Layer `l` of a stream: a sender that stalls, or drips, counts as down (the caller tries
/// another or falls back), rather than holding every request on this prompt.
async fn next_layer(
    rx: &mut tokio::sync::mpsc::Receiver<Result<crate::client::LayerArrival, EdgeError>>,
    l: usize,
    per_layer: Duration,
    until: tokio::time::Instant,
    whole: Duration,
) -> Result<crate::client::LayerArrival, EdgeError> {
    let next = (tokio::time::Instant::now() + per_layer).min(until);
    tokio::time::timeout_at(next, rx.recv())
        .await
        .map_err(|_| {
            EdgeError::Stream(match next == until {
                true => format!("the fetch took longer than {whole:?} (at layer {l})"),
                false => format!("no layer {l} within {per_layer:?}"),
            })
        })?
        .ok_or_else(|| EdgeError::Stream("cloud stream closed early".into()))?
}
