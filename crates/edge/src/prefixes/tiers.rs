//! The tiers below memory: this edge's disk, its peers, the cloud's object store, the cloud,
//! then computing here; what is kept on disk, and every stored prompt checked before use.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use edgeprompt_engine::PrefixKv;
use edgeprompt_kv::{content_address, Expect, Seal};
use edgeprompt_protocol::PromptRef;

use super::flight::Slot;
use super::{Got, LookupError, Prefixes, Reach, Source, UnknownSystem};
use crate::layer_stream::Wire;
use crate::EdgeError;

impl Prefixes {
    /// What goes to the disk tier: only public prompts (a private system message is never
    /// written down), never KV from a peer unless its cloud signature was checked, never
    /// unsigned KV where only signed KV is read back, and no exact fallback of a CE-LSLM edge
    /// (after a restart it asks the cloud again for the mix its peers serve).
    pub(super) fn keeps_on_disk(&self, source: Source, signed: bool, public: bool) -> bool {
        let readable = signed || !self.verifies();
        match source {
            Source::Cloud | Source::Store => readable,
            Source::Peer => signed && self.verifies(),
            Source::Local => public && readable && !self.lslm(),
            Source::Memory | Source::Disk => false,
        }
    }

    /// A prompt from the disk tier, only if it is the one `key` names (its ids hash to the
    /// address), fits this model, and, with the cloud's key, carries its signature on every
    /// layer. Anything else is ignored (and fetched again), never used.
    pub(super) async fn read_disk(&self, key: &str) -> Option<(PrefixKv, Option<Seal>)> {
        let disk = self.disk.clone()?;
        let k = key.to_string();
        let expect = Expect::of(&self.model.cfg);
        let got = tokio::task::spawn_blocking(move || disk.get(&k, &expect))
            .await
            .ok()?;
        let (p, seal) = match got {
            Ok(Some(x)) => x,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!("disk tier: {e}; ignoring the entry");
                return None;
            }
        };
        let address = key.split('-').next().unwrap_or(key);
        let vetted = self
            .vet(&format!("disk tier: {key}"), address, p, seal)
            .await;
        if let Err(Refused::Forged(_)) = &vetted {
            // Not the trusted key's: dropped, not kept to be refused again.
            if let Some(d) = &self.disk {
                let _ = d.remove(key);
            }
        }
        vetted.ok()
    }

    /// A published prompt from the cloud's object store (`kv_store`), checked as one from disk:
    /// read no longer than a prompt of `tokens` tokens (the list's count) can be, and held
    /// against the prompt cache's budget while it arrives.
    async fn read_store(&self, address: &str, tokens: usize) -> Option<(PrefixKv, Option<Seal>)> {
        let store = match &self.cfg.kv_store {
            Some(s) => s.clone(),
            None => self.listed_store()?,
        };
        let mut expect = Expect::of(&self.model.cfg);
        expect.max_tokens = expect.max_tokens.min(tokens);
        let _held = match self.hold(self.model.cfg.prompt_bytes(tokens), false) {
            Ok(h) => h,
            Err(e) => {
                tracing::info!("object store: {address} not read now: {e}");
                return None;
            }
        };
        let (p, seal) = match store.get(&self.model.fingerprint, address, &expect).await {
            Ok(Some(x)) => x,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!("object store: {e}; asking the cloud");
                return None;
            }
        };
        self.vet(&format!("object store: {address}"), address, p, seal)
            .await
            .ok()
    }

    /// The store the cloud's signed list names (unless told not to read it), opened when the
    /// list first names it or names another.
    fn listed_store(&self) -> Option<Arc<edgeprompt_kv::BucketStore>> {
        if !self.cfg.listed_store {
            return None;
        }
        let url = self.catalog.current().store.clone()?;
        // Plain HTTP only where the cloud is reached without TLS too, or on this machine:
        // otherwise anyone on the path would see which published prompts this edge uses.
        let cloud_plain = self
            .cfg
            .cloud_url
            .as_deref()
            .is_some_and(|c| c.starts_with("http://"));
        if !(crate::client::plaintext_ok(&url) || cloud_plain) {
            tracing::warn!("the cloud names a store over plain HTTP ({url}); not read");
            return None;
        }
        let mut open = self.listed_store.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, s)) = open.as_ref().filter(|(u, _)| *u == url) {
            return Some(s.clone());
        }
        match edgeprompt_kv::BucketStore::open_listed(&url) {
            Ok(s) => {
                tracing::info!("reading published prompts from the store the cloud names: {url}");
                let s = Arc::new(s);
                *open = Some((url, s.clone()));
                Some(s)
            }
            Err(e) => {
                tracing::warn!("{e}");
                None
            }
        }
    }

    /// A stored prompt is taken only if it is the one `address` names (its ids hash to it),
    /// fits this model, and, with the cloud's key, carries its signature on every layer.
    async fn vet(
        &self,
        what: &str,
        address: &str,
        p: PrefixKv,
        seal: Option<Seal>,
    ) -> Result<(PrefixKv, Option<Seal>), Refused> {
        let refuse = |why: Refused| {
            tracing::warn!("{what} refused: {}; taking it from elsewhere", why.reason());
            Err(why)
        };
        if let Err(e) = p.check_fits(&self.model.cfg, &self.model.fingerprint) {
            return refuse(Refused::Unfit(e.to_string()));
        }
        if content_address(&p.fingerprint, &p.token_ids) != address {
            return refuse(Refused::Unfit(
                "its token ids are not the prompt it is named for".into(),
            ));
        }
        let trust = match self.catalog.key().await {
            Ok(t) => t,
            Err(e) => return refuse(Refused::Unfit(e.to_string())),
        };
        if let Some(trust) = &trust {
            match &seal {
                None => {
                    return refuse(Refused::Unfit(
                        "unsigned, and this edge takes only signed KV".into(),
                    ))
                }
                Some(s) => {
                    if let Err(e) = s.verify_whole(trust, &p, |c| self.takes_codec(c)) {
                        return refuse(Refused::Forged(e.to_string()));
                    }
                }
            }
        }
        Ok((p, seal))
    }

    /// Keep a copy on disk (in the background; a failure only costs the next restart a fetch).
    pub(super) fn write_disk(&self, prefix: &Arc<PrefixKv>, seal: Option<Arc<Seal>>) {
        let Some(disk) = self.disk.clone() else {
            return;
        };
        let prefix = prefix.clone();
        let key = self.key(&content_address(&prefix.fingerprint, &prefix.token_ids));
        let writes = self.writes.clone();
        writes.fetch_add(1, Ordering::AcqRel);
        let metrics = self.metrics.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = disk.put(&key, &prefix, seal.as_deref()) {
                metrics.disk_write_errors.inc();
                tracing::warn!("disk tier: could not store {key}: {e}");
            }
            writes.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// The tiers below memory, in order: disk, peers, the cloud's object store, the cloud,
    /// then compute here. A private
    /// prompt goes straight to the last: no tier below memory ever sees it; a published one
    /// reached `Here` only reads the disk first.
    pub(super) async fn fetch_or_compute(
        &self,
        prompt: PromptRef,
        address: Option<&str>,
        ids: Option<&[u32]>,
        reach: Reach,
        slot: Option<&Arc<Slot>>,
    ) -> Result<Got, LookupError> {
        let local = |prefix| Got {
            prefix,
            source: Source::Local,
            seal: None,
            wire: Wire::default(),
        };
        // The disk tier is this edge's own: it holds only prompts the cloud published (a
        // private one is never written there), so it is read whether or not the cloud's list
        // can be had now: a restart without the cloud still finds them.
        if let Some(a) = address {
            if let Some((prefix, seal)) = self.read_disk(a).await {
                return Ok(Got {
                    prefix,
                    source: Source::Disk,
                    seal,
                    wire: Wire::default(),
                });
            }
        }
        match reach {
            Reach::Private => {
                let ids = ids.ok_or_else(|| {
                    LookupError::Failed("a private prompt without its tokens".into())
                })?;
                if self.cfg.unknown_system == UnknownSystem::Refuse {
                    return Err(LookupError::UnknownSystem);
                }
                return Ok(local(self.compute(ids).await?));
            }
            // Published, but neither held nor arriving (past the prefetch budget, or its
            // prefetch failed): asking for it now would tell the cloud it was used.
            Reach::Here => {
                let ids = ids.ok_or_else(|| {
                    LookupError::Failed("a published prompt without its tokens".into())
                })?;
                return Ok(local(self.compute(ids).await?));
            }
            Reach::Anywhere => {}
        }
        if let Some(a) = address {
            let by_address = PromptRef::ContentAddress(hex::decode(a).unwrap_or_default());
            // Peers hold exact prefixes; a CE-LSLM edge takes its mix from the cloud.
            let peers = match self.lslm() {
                false => self.cfg.peers.as_slice(),
                true => &[],
            };
            for peer in peers {
                match self
                    .fetch(std::slice::from_ref(peer), by_address.clone(), ids, None, 0)
                    .await
                {
                    Ok((prefix, seal, wire)) => {
                        return Ok(Got {
                            prefix,
                            source: Source::Peer,
                            seal,
                            wire,
                        })
                    }
                    Err(e) => tracing::info!("peer {peer} has no copy ({e})"),
                }
            }
        }
        // The cloud's object store (a CDN, for many edges) before the cloud itself; a CE-LSLM
        // edge takes its mix from the cloud.
        let listed = address.and_then(|a| self.catalog.current().at(a).map(|l| l.tokens));
        if let (Some(a), Some(tokens), false) =
            (address, ids.map(<[u32]>::len).or(listed), self.lslm())
        {
            if let Some((prefix, seal)) = self.read_store(a, tokens).await {
                return Ok(Got {
                    prefix,
                    source: Source::Store,
                    seal,
                    wire: Wire::default(),
                });
            }
        }
        let first = self.cloud_first_layer(ids.map(<[u32]>::len));
        let fetched = match (&self.cfg.cloud_url, ids) {
            // The planner computes every layer here: the cloud has nothing to add.
            (Some(_), Some(ids)) if first >= self.model.cfg.n_layer => {
                return Ok(local(self.compute(ids).await?));
            }
            (Some(_), _) => {
                let first = first.min(self.model.cfg.n_layer - 1);
                let urls = self.cloud_order(&prompt);
                Some(self.fetch(&urls, prompt.clone(), ids, slot, first).await)
            }
            (None, _) => None,
        };
        // A prompt named by id that failed after its header: its tokens are known now.
        // With the cloud's key, only once a signed layer bound them to the prompt: an unsigned
        // header's ids are the sender's choice.
        let streamed = slot.and_then(|s| {
            s.borrow()
                .as_ref()
                .filter(|s| !self.verifies() || s.vouched())
                .map(|s| s.token_ids().to_vec())
        });
        let ids = ids.or(streamed.as_deref());
        let by_id = |id: &str| LookupError::UnknownId(id.to_string());
        match (fetched, ids, &prompt) {
            (Some(Ok((prefix, seal, wire))), _, _) => Ok(Got {
                prefix,
                source: Source::Cloud,
                seal,
                wire,
            }),
            (Some(Err(EdgeError::NotFound(_))) | None, None, PromptRef::Id(id)) => Err(by_id(id)),
            (Some(Err(EdgeError::Busy(m))), None, _) => Err(LookupError::Busy(m)),
            (Some(Err(EdgeError::TooLong(m))), _, _) => Err(LookupError::TooLong(m)),
            (Some(Err(e)), None, _) => Err(LookupError::Failed(e.to_string())),
            (Some(Err(EdgeError::NotFound(_))) | None, Some(_), _)
                if self.cfg.unknown_system == UnknownSystem::Refuse =>
            {
                Err(LookupError::UnknownSystem)
            }
            (fetched, Some(ids), _) => {
                // The cloud does not know the prompt, or is down, or died mid-stream: compute
                // it here; the KV is the same bit for bit, so is the answer.
                if let Some(Err(e)) = fetched {
                    if !matches!(e, EdgeError::NotFound(_)) {
                        tracing::warn!("cloud unavailable ({e}); computing the prompt here");
                    }
                }
                Ok(local(self.compute(ids).await?))
            }
            (None, None, PromptRef::ContentAddress(_)) => {
                Err(LookupError::Failed("no cloud configured".into()))
            }
        }
    }
}

/// Why a stored prompt was not taken.
enum Refused {
    /// Not this model's, not the prompt named, unsigned, or no key to check it with.
    Unfit(String),
    /// Signed, but not by the trusted key (or altered since).
    Forged(String),
}

impl Refused {
    fn reason(&self) -> &str {
        match self {
            Refused::Unfit(r) | Refused::Forged(r) => r,
        }
    }
}
