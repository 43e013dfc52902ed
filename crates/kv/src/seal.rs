//! Signed KV: the cloud signs, layer by layer, what an edge will attend to, so a peer, a shared
//! store or a disk can relay a cloud prompt's KV but cannot alter it.
//!
//! What is signed for layer `l` is the prompt's [`Manifest`] (whose KV: prompt id, model
//! fingerprint, content address of the token ids, shape, first layer, codec, mapped or exact)
//! and the SHA-256 of layer `l`'s *decoded* values with their positions. Hashing the decoded
//! values, not the wire bytes, keeps a signature valid through every tier (wire chunks, the
//! disk's f16 chunks, Redis) and lets each layer be checked the moment it is complete, before
//! any private token attends to it.

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use edgeprompt_engine::{LayerKv, PrefixKv};
use sha2::{Digest, Sha256};

use crate::codec::Codec;
use crate::layers::LayerMap;
use crate::{content_address, KvError, Result};

/// Bytes of one signature.
pub const SIGNATURE_BYTES: usize = 64;

/// Whose KV a stream or a stored prefix is: everything a signature binds besides the values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub prompt_id: String,
    /// Fingerprint of the model whose KV this is (the edge model's, for mapped KV).
    pub fingerprint: String,
    /// `content_address(fingerprint, token_ids)`, hex.
    pub address: String,
    pub n_layers: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Layers below it are not the cloud's (CE-LSLM computes them at the edge).
    pub first_layer: usize,
    /// The values are what this codec decodes to.
    pub codec: Codec,
    /// A larger model's KV mapped through adapters (CE-LSLM), not the model's own.
    pub mapped: bool,
    /// Per layer, head sizes and the layers whose KV others read, when the model's layers
    /// differ (Gemma 4): signed with every layer, so no layer can be claimed owned or not.
    pub layers: LayerMap,
    /// The edge model's own KV fused with a larger model's by the fuser with this SHA-256
    /// (CE-LSLM fuser); empty: not fused.
    pub fuser: String,
}

impl Manifest {
    /// The manifest of a prompt's KV with these token ids.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        prompt_id: &str,
        fingerprint: &str,
        token_ids: &[u32],
        shape: (usize, usize, usize),
        first_layer: usize,
        codec: Codec,
        mapped: bool,
    ) -> Self {
        Self {
            prompt_id: prompt_id.to_string(),
            fingerprint: fingerprint.to_string(),
            address: content_address(fingerprint, token_ids),
            n_layers: shape.0,
            n_kv_head: shape.1,
            head_dim: shape.2,
            first_layer,
            codec,
            mapped,
            layers: LayerMap::default(),
            fuser: String::new(),
        }
    }

    /// The same manifest for KV fused by the fuser `sha256` (hex).
    pub fn with_fuser(mut self, sha256: &str) -> Self {
        self.fuser = sha256.to_string();
        self
    }

    /// The same manifest for a model whose layers differ (`LayerMap`).
    pub fn with_layers(mut self, layers: LayerMap) -> Self {
        self.layers = layers;
        self
    }

    /// The bytes signed for layer `l` with values hashing to `digest`.
    fn statement(&self, l: usize, digest: &[u8; 32]) -> Vec<u8> {
        let mut m = Vec::with_capacity(256);
        m.extend_from_slice(b"edgeprompt-kv-seal-v1\0");
        for s in [
            self.prompt_id.as_str(),
            &self.fingerprint,
            &self.address,
            self.codec.name(),
        ] {
            m.extend_from_slice(&(s.len() as u32).to_le_bytes());
            m.extend_from_slice(s.as_bytes());
        }
        for n in [
            self.n_layers,
            self.n_kv_head,
            self.head_dim,
            self.first_layer,
            self.mapped as usize,
            l,
        ] {
            m.extend_from_slice(&(n as u64).to_le_bytes());
        }
        // Only where layers differ, so every other model's statement is as it always was.
        if !self.layers.head_dims.is_empty() {
            m.extend_from_slice(b"layers\0");
            m.extend_from_slice(&(self.layers.head_dims.len() as u64).to_le_bytes());
            for (&d, &s) in self.layers.head_dims.iter().zip(&self.layers.kv_sources) {
                m.extend_from_slice(&(d as u64).to_le_bytes());
                m.extend_from_slice(&(s as u64).to_le_bytes());
            }
        }
        // Only for fused KV, likewise: which fuser made it is signed with every layer.
        if !self.fuser.is_empty() {
            m.extend_from_slice(b"fused\0");
            m.extend_from_slice(&(self.fuser.len() as u32).to_le_bytes());
            m.extend_from_slice(self.fuser.as_bytes());
        }
        m.extend_from_slice(digest);
        m
    }
}

/// One published prompt as a cloud's list names it: id, token count, content address (hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    pub id: String,
    pub tokens: u32,
    pub address: String,
}

/// The bytes signed for a cloud's list of published prompts to a model: without the cloud's
/// signature a path could add addresses of its choosing, and an edge would name a private
/// system message whose address it guessed.
fn list_statement(fingerprint: &str, entries: &[ListEntry]) -> Vec<u8> {
    let mut m = Vec::with_capacity(64 + entries.len() * 96);
    m.extend_from_slice(b"edgeprompt-list-v1\0");
    for s in std::iter::once(fingerprint).chain(
        entries
            .iter()
            .flat_map(|e| [e.id.as_str(), e.address.as_str()]),
    ) {
        m.extend_from_slice(&(s.len() as u32).to_le_bytes());
        m.extend_from_slice(s.as_bytes());
    }
    for e in entries {
        m.extend_from_slice(&e.tokens.to_le_bytes());
    }
    m
}

/// Freshness of a list: when the cloud issued it (ms since the Unix epoch) and for how many
/// seconds an edge may take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Issued {
    pub unix_ms: u64,
    pub max_age_secs: u32,
}

/// The store statement: where a cloud's list says its published prompts' objects are, for one
/// model, at the list's issue time (so an old list's store cannot be replayed into a new one).
fn store_statement(fingerprint: &str, url: &str, issued_unix_ms: u64) -> Vec<u8> {
    let mut m = Vec::with_capacity(64 + fingerprint.len() + url.len());
    m.extend_from_slice(b"edgeprompt-store-v1\0");
    m.extend_from_slice(&issued_unix_ms.to_le_bytes());
    for s in [fingerprint, url] {
        m.extend_from_slice(&(s.len() as u32).to_le_bytes());
        m.extend_from_slice(s.as_bytes());
    }
    m
}

/// The fresh list statement: its own tag, the freshness, then the v1 statement after its tag
/// (so a v1 signature can never stand for a fresh one).
fn fresh_list_statement(fingerprint: &str, entries: &[ListEntry], at: Issued) -> Vec<u8> {
    const V1: &[u8] = b"edgeprompt-list-v1\0";
    let v1 = list_statement(fingerprint, entries);
    let mut m = Vec::with_capacity(v1.len() + 32);
    m.extend_from_slice(b"edgeprompt-list-v2\0");
    m.extend_from_slice(&at.unix_ms.to_le_bytes());
    m.extend_from_slice(&at.max_age_secs.to_le_bytes());
    m.extend_from_slice(&v1[V1.len()..]);
    m
}

/// SHA-256 of a layer's values and the positions they sit at; for a recurrent layer, of its
/// state and the position it is at (its own tag: a state's digest is never a KV layer's).
pub fn layer_digest(layer: &LayerKv) -> [u8; 32] {
    if let Some(st) = &layer.state {
        let mut h = Sha256::new();
        h.update(b"edgeprompt-state-v1\0");
        for n in [layer.end(), st.conv.len(), st.matrix.len()] {
            h.update((n as u64).to_le_bytes());
        }
        h.update(st.to_le_bytes());
        return h.finalize().into();
    }
    let mut h = Sha256::new();
    h.update(b"edgeprompt-layer-v1\0");
    for n in [layer.start(), layer.end(), layer.n_kv_head, layer.head_dim] {
        h.update((n as u64).to_le_bytes());
    }
    let mut buf = Vec::new();
    for head in 0..layer.n_kv_head {
        for part in [layer.keys(head), layer.values(head)] {
            buf.clear();
            buf.extend(part.iter().flat_map(|x| x.to_bits().to_le_bytes()));
            h.update(&buf);
        }
    }
    h.finalize().into()
}

/// A cloud's signing key.
pub struct SealKey(SigningKey);

impl SealKey {
    pub fn from_seed(seed: [u8; 32]) -> Self {
        Self(SigningKey::from_bytes(&seed))
    }

    /// A new key from the system's randomness, and its seed (what a key file holds).
    pub fn generate() -> Result<(Self, [u8; 32])> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| KvError::Seal(format!("no randomness: {e}")))?;
        Ok((Self::from_seed(seed), seed))
    }

    /// A key from its hex seed (a key file's text).
    pub fn from_hex(text: &str) -> Result<Self> {
        let seed: [u8; 32] = hex32(text, "signing key")?;
        Ok(Self::from_seed(seed))
    }

    pub fn public(&self) -> TrustKey {
        TrustKey(self.0.verifying_key())
    }

    pub fn sign_layer(&self, m: &Manifest, l: usize, layer: &LayerKv) -> [u8; 64] {
        self.sign_digest(m, l, &layer_digest(layer))
    }

    pub fn sign_digest(&self, m: &Manifest, l: usize, digest: &[u8; 32]) -> [u8; 64] {
        self.0.sign(&m.statement(l, digest)).to_bytes()
    }

    /// The signature of the list of prompts published to the model of `fingerprint`.
    pub fn sign_list(&self, fingerprint: &str, entries: &[ListEntry]) -> [u8; 64] {
        self.0
            .sign(&list_statement(fingerprint, entries))
            .to_bytes()
    }

    /// The signature of the store a list issued at `issued_unix_ms` names for `fingerprint`.
    pub fn sign_store(&self, fingerprint: &str, url: &str, issued_unix_ms: u64) -> [u8; 64] {
        self.0
            .sign(&store_statement(fingerprint, url, issued_unix_ms))
            .to_bytes()
    }

    /// The signature of a list with its freshness (`Issued`).
    pub fn sign_list_fresh(
        &self,
        fingerprint: &str,
        entries: &[ListEntry],
        at: Issued,
    ) -> [u8; 64] {
        self.0
            .sign(&fresh_list_statement(fingerprint, entries, at))
            .to_bytes()
    }
}

/// A cloud's public key: what an edge trusts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TrustKey(VerifyingKey);

impl std::fmt::Debug for TrustKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TrustKey({})", self.to_hex())
    }
}

impl TrustKey {
    /// A key from its hex form (a `.pub` file's text).
    pub fn from_hex(text: &str) -> Result<Self> {
        let b: [u8; 32] = hex32(text, "public key")?;
        VerifyingKey::from_bytes(&b)
            .map(Self)
            .map_err(|e| KvError::Seal(format!("public key: {e}")))
    }

    /// A key as the cloud's list carries it (32 bytes).
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let b: [u8; 32] = b
            .try_into()
            .map_err(|_| KvError::Seal(format!("a public key of {} bytes", b.len())))?;
        VerifyingKey::from_bytes(&b)
            .map(Self)
            .map_err(|e| KvError::Seal(format!("public key: {e}")))
    }

    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0.as_bytes())
    }

    /// What logs and errors show of a key: its first 16 hex digits.
    pub fn short(&self) -> String {
        self.to_hex()[..16].to_string()
    }

    /// Whether `sig` is this key's signature of the list `entries` published to `fingerprint`.
    pub fn verify_list(&self, fingerprint: &str, entries: &[ListEntry], sig: &[u8]) -> Result<()> {
        let bad = || KvError::Seal("the list of prompts is not signed by the cloud's key".into());
        let sig = Signature::from_slice(sig).map_err(|_| bad())?;
        self.0
            .verify(&list_statement(fingerprint, entries), &sig)
            .map_err(|_| bad())
    }

    /// Whether `sig` is this key's signature of the list with its freshness `at`.
    pub fn verify_list_fresh(
        &self,
        fingerprint: &str,
        entries: &[ListEntry],
        at: Issued,
        sig: &[u8],
    ) -> Result<()> {
        let bad = || {
            KvError::Seal(
                "the list of prompts carries no signed issue time from the cloud's key".into(),
            )
        };
        let sig = Signature::from_slice(sig).map_err(|_| bad())?;
        self.0
            .verify(&fresh_list_statement(fingerprint, entries, at), &sig)
            .map_err(|_| bad())
    }

    /// Whether `sig` is this key's signature of the store `url` in a list issued at
    /// `issued_unix_ms` to `fingerprint`.
    pub fn verify_store(
        &self,
        fingerprint: &str,
        url: &str,
        issued_unix_ms: u64,
        sig: &[u8],
    ) -> Result<()> {
        let bad = || KvError::Seal("the list's store is not signed by the cloud's key".into());
        let sig = Signature::from_slice(sig).map_err(|_| bad())?;
        self.0
            .verify(&store_statement(fingerprint, url, issued_unix_ms), &sig)
            .map_err(|_| bad())
    }

    /// Whether `sig` is this key's signature of layer `l` of `m` holding `layer`.
    pub fn verify_layer(&self, m: &Manifest, l: usize, layer: &LayerKv, sig: &[u8]) -> Result<()> {
        let bad = || KvError::Seal(format!("layer {l}: the signature does not match the KV"));
        let sig = Signature::from_slice(sig).map_err(|_| bad())?;
        self.0
            .verify(&m.statement(l, &layer_digest(layer)), &sig)
            .map_err(|_| bad())
    }
}

/// A prefix's signatures, kept with it on disk and in Redis: the manifest fields a stored
/// prefix does not already carry, and one signature per layer from `first_layer` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seal {
    pub prompt_id: String,
    pub codec: Codec,
    pub first_layer: usize,
    pub mapped: bool,
    pub signatures: Vec<[u8; 64]>,
}

impl Seal {
    /// The manifest of `prefix` under this seal.
    pub fn manifest(&self, prefix: &PrefixKv) -> Manifest {
        let first = prefix.layers.first();
        Manifest::new(
            &self.prompt_id,
            &prefix.fingerprint,
            &prefix.token_ids,
            (
                prefix.layers.len(),
                first.map_or(0, |l| l.n_kv_head),
                first.map_or(0, |l| l.head_dim),
            ),
            self.first_layer,
            self.codec,
            self.mapped,
        )
        .with_layers(LayerMap::of_layers(&prefix.layers))
    }

    /// The layers of `prefix` a seal signs: from `first_layer` on, but those that read
    /// another layer's KV (they hold none).
    fn signed(&self, prefix: &PrefixKv) -> Vec<usize> {
        (self.first_layer..prefix.layers.len())
            .filter(|&l| prefix.layers[l].kv_of.is_none())
            .collect()
    }

    /// Layer `l`'s signature, if this seal signs it.
    pub fn signature_of(&self, prefix: &PrefixKv, l: usize) -> Option<&[u8; 64]> {
        let at = self.signed(prefix).iter().position(|&s| s == l)?;
        self.signatures.get(at)
    }

    /// Every layer from `first_layer` on is `key`'s, unaltered.
    pub fn verify(&self, key: &TrustKey, prefix: &PrefixKv) -> Result<()> {
        let m = self.manifest(prefix);
        let signed = self.signed(prefix);
        if self.first_layer > prefix.layers.len() || self.signatures.len() != signed.len() {
            return Err(KvError::Seal(format!(
                "{} signatures for the {} layers of {}..{} that hold KV",
                self.signatures.len(),
                signed.len(),
                self.first_layer,
                prefix.layers.len()
            )));
        }
        for (&l, sig) in signed.iter().zip(&self.signatures) {
            key.verify_layer(&m, l, &prefix.layers[l], sig)?;
        }
        Ok(())
    }

    /// `verify`, for a prefix kept whole (a disk file, a shared-tier value): the seal must cover
    /// every layer of exact (not mapped) KV, with values of a codec `takes`.
    pub fn verify_whole(
        &self,
        key: &TrustKey,
        prefix: &PrefixKv,
        takes: impl Fn(Codec) -> bool,
    ) -> Result<()> {
        if self.first_layer != 0 || self.mapped || !takes(self.codec) {
            return Err(KvError::Seal(format!(
                "a seal from layer {} of {} values (mapped: {}), not the whole exact KV taken here",
                self.first_layer,
                self.codec.name(),
                self.mapped
            )));
        }
        self.verify(key, prefix)
    }

    /// Sign every layer of `prefix` from `first_layer` on.
    pub fn sign(
        key: &SealKey,
        prompt_id: &str,
        prefix: &PrefixKv,
        codec: Codec,
        first_layer: usize,
        mapped: bool,
    ) -> Self {
        let mut seal = Self {
            prompt_id: prompt_id.to_string(),
            codec,
            first_layer,
            mapped,
            signatures: Vec::new(),
        };
        let m = seal.manifest(prefix);
        seal.signatures = seal
            .signed(prefix)
            .into_iter()
            .map(|l| key.sign_layer(&m, l, &prefix.layers[l]))
            .collect();
        seal
    }
}

fn hex32(text: &str, what: &str) -> Result<[u8; 32]> {
    let b = hex::decode(text.trim()).map_err(|e| KvError::Seal(format!("{what}: {e}")))?;
    b.try_into()
        .map_err(|_| KvError::Seal(format!("{what}: not 32 bytes of hex")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn prefix() -> PrefixKv {
        let layers = (0..3)
            .map(|l| {
                let mut kv = LayerKv::new(2, 8);
                let k: Vec<f32> = (0..5 * 16).map(|i| (i * (l + 1)) as f32 * 0.01).collect();
                kv.append(&k, &k, 5);
                Arc::new(kv)
            })
            .collect();
        PrefixKv {
            fingerprint: "fp".into(),
            token_ids: vec![1, 2, 3, 4, 5],
            layers,
        }
    }

    /// A model whose layers differ (Gemma 4): the layer map is in every layer's statement, so
    /// a seal made for one map does not verify under another (a layer said to own KV, or not).
    #[test]
    fn the_layer_map_is_signed_with_every_layer() {
        let mut p = prefix();
        p.layers[2] = Arc::new(LayerKv::reading(2, 8, 5, 1));
        let key = SealKey::from_seed([5; 32]);
        let seal = Seal::sign(&key, "doc", &p, Codec::F16, 0, false);
        assert_eq!(seal.signatures.len(), 2);
        seal.verify(&key.public(), &p).unwrap();
        let m = seal.manifest(&p);
        assert_eq!(m.layers.kv_sources, [0, 1, 1]);
        let other = m.clone().with_layers(LayerMap {
            head_dims: vec![8, 8, 8],
            kv_sources: vec![0, 0, 1],
        });
        let sig = seal.signature_of(&p, 0).unwrap();
        key.public().verify_layer(&m, 0, &p.layers[0], sig).unwrap();
        assert!(key
            .public()
            .verify_layer(&other, 0, &p.layers[0], sig)
            .is_err());
        // Every other model's statement is unchanged by the map's existence.
        let plain = prefix();
        let m = Seal::sign(&key, "doc", &plain, Codec::F16, 0, false).manifest(&plain);
        assert!(m.layers.head_dims.is_empty());
    }

    #[test]
    fn a_signed_list_verifies_and_an_added_address_breaks_it() {
        let key = SealKey::from_seed([7; 32]);
        let e = |id: &str, a: u8| ListEntry {
            id: id.into(),
            tokens: 30,
            address: hex::encode([a; 32]),
        };
        let list = vec![e("support", 1), e("coding", 2)];
        let sig = key.sign_list("fp", &list);
        key.public().verify_list("fp", &list, &sig).unwrap();
        let mut added = list.clone();
        added.push(e("guess", 3));
        let mut retitled = list.clone();
        retitled[0].tokens = 31;
        for (what, l, fp) in [
            ("an added address", &added, "fp"),
            ("a changed count", &retitled, "fp"),
            ("another model", &list, "fp2"),
        ] {
            assert!(key.public().verify_list(fp, l, &sig).is_err(), "{what}");
        }
        let other = SealKey::from_seed([8; 32]);
        assert!(other.public().verify_list("fp", &list, &sig).is_err());
    }

    #[test]
    fn a_signed_store_binds_its_url_model_and_issue_time() {
        let key = SealKey::from_seed([7; 32]);
        let url = "https://cdn.example/edgeprompt";
        let sig = key.sign_store("fp", url, 1_700_000_000_000);
        key.public()
            .verify_store("fp", url, 1_700_000_000_000, &sig)
            .unwrap();
        for (what, fp, u, at) in [
            (
                "another url",
                "fp",
                "https://evil.example/edgeprompt",
                1_700_000_000_000,
            ),
            ("another model", "fp2", url, 1_700_000_000_000),
            ("another list's time", "fp", url, 1_700_000_000_001),
        ] {
            assert!(
                key.public().verify_store(fp, u, at, &sig).is_err(),
                "{what}"
            );
        }
        let other = SealKey::from_seed([8; 32]);
        assert!(other
            .public()
            .verify_store("fp", url, 1_700_000_000_000, &sig)
            .is_err());
        // A list's signature is no store's (their tags differ).
        let list_sig = key.sign_list("fp", &[]);
        assert!(key.public().verify_store("fp", "", 0, &list_sig).is_err());
    }

    #[test]
    fn a_fresh_list_binds_its_issue_time_and_age() {
        let key = SealKey::from_seed([7; 32]);
        let list = vec![ListEntry {
            id: "support".into(),
            tokens: 30,
            address: hex::encode([1; 32]),
        }];
        let at = Issued {
            unix_ms: 1_700_000_000_000,
            max_age_secs: 300,
        };
        let sig = key.sign_list_fresh("fp", &list, at);
        key.public()
            .verify_list_fresh("fp", &list, at, &sig)
            .unwrap();
        for (what, changed) in [
            (
                "a later issue time",
                Issued {
                    unix_ms: at.unix_ms + 1,
                    ..at
                },
            ),
            (
                "a longer age",
                Issued {
                    max_age_secs: 301,
                    ..at
                },
            ),
        ] {
            let e = key.public().verify_list_fresh("fp", &list, changed, &sig);
            assert!(e.is_err(), "{what}");
        }
        // Neither signature stands for the other.
        let v1 = key.sign_list("fp", &list);
        assert!(key
            .public()
            .verify_list_fresh("fp", &list, at, &v1)
            .is_err());
        assert!(key.public().verify_list("fp", &list, &sig).is_err());
    }

    #[test]
    fn a_signed_prefix_verifies_and_any_change_breaks_it() {
        let key = SealKey::from_seed([7; 32]);
        let trust = key.public();
        let p = prefix();
        let seal = Seal::sign(&key, "doc", &p, Codec::F16, 0, false);
        seal.verify(&trust, &p).unwrap();
        assert_eq!(TrustKey::from_hex(&trust.to_hex()).unwrap(), trust);

        // One value changed in one layer.
        let mut bad = p.clone();
        let mut l1 = (*bad.layers[1]).clone();
        l1.truncate(4);
        bad.layers[1] = Arc::new(l1);
        assert!(seal.verify(&trust, &bad).is_err());
        // Another prompt's ids, the same values (a replayed seal).
        let mut other = p.clone();
        other.token_ids[0] = 9;
        assert!(seal.verify(&trust, &other).is_err());
        // The same layers said to be another prompt, codec or layout.
        for s in [
            Seal {
                prompt_id: "other".into(),
                ..seal.clone()
            },
            Seal {
                codec: Codec::Int8,
                ..seal.clone()
            },
            Seal {
                mapped: true,
                ..seal.clone()
            },
        ] {
            assert!(s.verify(&trust, &p).is_err());
        }
        // Layers moved: signature of layer 0 on layer 1.
        let mut swapped = seal.clone();
        swapped.signatures.swap(0, 1);
        assert!(swapped.verify(&trust, &p).is_err());
        // A missing signature, or another key.
        let mut short = seal.clone();
        short.signatures.pop();
        assert!(short.verify(&trust, &p).is_err());
        let other_key = SealKey::from_seed([8; 32]).public();
        assert!(seal.verify(&other_key, &p).is_err());
    }

    #[test]
    fn a_seal_from_a_later_layer_covers_only_those() {
        let key = SealKey::from_seed([1; 32]);
        let p = prefix();
        let seal = Seal::sign(&key, "", &p, Codec::Int4Ch, 1, true);
        assert_eq!(seal.signatures.len(), 2);
        seal.verify(&key.public(), &p).unwrap();
        // Valid, but not a whole exact prefix: refused where one is kept.
        assert!(seal.verify_whole(&key.public(), &p, |_| true).is_err());
        let whole = Seal::sign(&key, "", &p, Codec::Int8, 0, false);
        whole
            .verify_whole(&key.public(), &p, |c| c == Codec::Int8)
            .unwrap();
        assert!(whole
            .verify_whole(&key.public(), &p, |c| c == Codec::F16)
            .is_err());
        // Layer 0 (computed at the edge) may be anything.
        let mut q = p.clone();
        q.layers[0] = p.layers[2].clone();
        seal.verify(&key.public(), &q).unwrap();
    }

    #[test]
    fn keys_parse_from_hex_and_refuse_garbage() {
        assert!(SealKey::from_hex(&"ab".repeat(32)).is_ok());
        assert!(SealKey::from_hex("abc").is_err());
        assert!(TrustKey::from_hex("zz").is_err());
        assert!(TrustKey::from_hex(&"00".repeat(31)).is_err());
    }

    /// docs/protocol.md's worked example, as the code computes it: the doc must hold this text
    /// verbatim, so another implementation can check its statement, digest and signature.
    /// Every number differs from the others, so a statement with two fields swapped differs.
    fn worked_example() -> String {
        use half::f16;
        let fingerprint = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let ids = [1u32, 2, 3];
        let (keys, values) = ([0.5f32, 0.25, 3.0, -0.125], [-1.0f32, 2.0, 0.75, -4.0]);
        let m = Manifest::new("tiny", fingerprint, &ids, (4, 1, 2), 1, Codec::F16, false);
        let head = |xs: [f32; 4]| vec![xs.map(f16::from_f32).to_vec()];
        // Layer 2 holds positions 1..3, as a sliding-window layer cut after position 0.
        let layer = LayerKv::from_heads(2, head(keys), head(values))
            .unwrap()
            .starting_at(1);
        let digest = layer_digest(&layer);
        let statement = m.statement(2, &digest);
        let key = SealKey::from_seed([7; 32]);
        let wrap = |b: &[u8]| {
            hex::encode(b)
                .as_bytes()
                .chunks(64)
                .map(|c| String::from_utf8_lossy(c).into_owned())
                .collect::<Vec<_>>()
                .join("\n")
        };
        let list = |xs: [f32; 4]| xs.map(|x| x.to_string()).join(" ");
        format!(
            "```text\n\
             prompt_id    tiny\n\
             fingerprint  {fingerprint}\n\
             token_ids    1 2 3\n\
             n_layers     4\n\
             n_kv_head    1\n\
             head_dim     2\n\
             first_layer  1\n\
             codec        f16\n\
             mapped       0\n\
             layer        2\n\
             positions    1 3\n\
             keys         {}\n\
             values       {}\n\
             seed         {}\n\
             \n\
             content address\n{}\n\
             layer digest\n{}\n\
             statement ({} bytes)\n{}\n\
             public key\n{}\n\
             signature\n{}\n\
             ```",
            list(keys),
            list(values),
            "07".repeat(32),
            m.address,
            hex::encode(digest),
            statement.len(),
            wrap(&statement),
            key.public().to_hex(),
            wrap(&key.sign_digest(&m, 2, &digest)),
        )
    }

    #[test]
    fn the_protocol_docs_worked_example_is_what_the_code_signs() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/protocol.md"
        ))
        .unwrap();
        let want = worked_example();
        assert!(
            doc.contains(&want),
            "docs/protocol.md must hold the worked example as computed:\n{want}"
        );
    }
}
