//! Where cloud-prompt KV lives between requests: a bytes-bounded in-memory LRU and a local disk
//! store (atomic writes, checksummed, survives restarts), both keyed by content address.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use edgeprompt_engine::PrefixKv;
use lru::LruCache;
use serde::{Deserialize, Serialize};

use edgeprompt_engine::recurrent::Recurrence;

use crate::chunk::{Chunk, Reassembler, MAX_CHUNK_TOKENS};
use crate::codec::Codec;
use crate::layers::LayerMap;
use crate::seal::{Seal, SIGNATURE_BYTES};
use crate::{KvError, Result};
use edgeprompt_engine::LayerKv;

/// What a stored prefix must be to be read at all: the reader's model's shape and limits,
/// checked on the header before anything the header claims is allocated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expect {
    pub n_layers: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Per layer head sizes and KV sources, where the model's layers differ (Gemma 4).
    pub layers: LayerMap,
    /// Most prompt tokens (the model's context).
    pub max_tokens: usize,
    /// Token ids must be below it.
    pub vocab_size: usize,
    /// A hybrid model's recurrent state shape (its layers that start at the prompt's end hold
    /// one).
    pub state: Option<Recurrence>,
}

impl Expect {
    pub fn of(cfg: &edgeprompt_engine::config::ModelConfig) -> Self {
        Self {
            n_layers: cfg.n_layer,
            n_kv_head: cfg.n_kv_head,
            head_dim: cfg.head_dim,
            layers: LayerMap::of(cfg),
            max_tokens: cfg.context_length,
            vocab_size: cfg.vocab_size,
            state: cfg.features.recurrence,
        }
    }

    /// Most bytes of one layer's state (0 without recurrent layers).
    fn max_state_bytes(&self) -> u64 {
        self.state.map_or(0, |s| s.state_bytes() as u64)
    }

    /// Whether a prompt's token ids fit: at most the context, each in the vocabulary.
    pub fn check_ids(&self, ids: &[u32]) -> Result<()> {
        if ids.len() > self.max_tokens {
            return Err(KvError::Bound(format!(
                "{} tokens, more than the model's context of {}",
                ids.len(),
                self.max_tokens
            )));
        }
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(KvError::Bound(format!(
                "token id {bad} is past the vocabulary of {}",
                self.vocab_size
            )));
        }
        Ok(())
    }

    /// Most bytes a stored prefix of this model can take: its header, and every layer's f16
    /// chunks for a whole context with their framing.
    pub fn max_stored_bytes(&self) -> u64 {
        let header = self.max_header_bytes() + 14;
        let chunks = (self.max_tokens / CHUNK_TOKENS + 1) as u64 * self.n_layers as u64;
        let dim = self.layers.max_head_dim(self.head_dim);
        let values = Codec::F16.chunk_bytes(self.n_kv_head, dim, self.max_tokens) as u64
            * self.n_layers as u64;
        header
            + values
            + chunks * (CHUNK_FRAME + 4096)
            + self.n_layers as u64 * (self.max_state_bytes() + 8)
    }

    /// Most bytes of a stored prefix's JSON header: an id is at most 10 digits and a comma;
    /// the rest (fingerprint, starts, seal) is small.
    fn max_header_bytes(&self) -> u64 {
        self.max_tokens as u64 * 11 + self.n_layers as u64 * 160 + (64 << 10)
    }
}

/// Bytes framing one stored chunk: layer, start, end, CRC, codec, compressed, length.
const CHUNK_FRAME: u64 = 4 * 4 + 2 + 8;

/// Open `path` for reading only if it is a regular file: never a FIFO, a device or a symlink
/// (whose target may be anywhere), and never blocking on the open. `None` if it does not exist.
pub fn open_regular(path: &Path) -> std::io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(std::io::Error::other("a symlink, not a file"))
        }
        Err(e) => return Err(e),
    };
    if !f.metadata()?.file_type().is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(Some(f))
}

/// In-memory LRU bounded by the KV bytes it holds.
pub struct MemoryStore {
    inner: Mutex<(LruCache<String, Arc<PrefixKv>>, usize)>,
    max_bytes: usize,
}

impl MemoryStore {
    pub fn new(max_bytes: usize) -> Self {
        Self {
            inner: Mutex::new((LruCache::unbounded(), 0)),
            max_bytes,
        }
    }

    pub fn get(&self, key: &str) -> Option<Arc<PrefixKv>> {
        let mut g = self.inner.lock().ok()?;
        g.0.get(key).cloned()
    }

    /// Insert, evicting least recently used entries until the bound holds. An entry larger
    /// than the whole bound is not kept.
    pub fn put(&self, key: &str, kv: Arc<PrefixKv>) {
        let size = kv.bytes();
        if size > self.max_bytes {
            return;
        }
        let Ok(mut g) = self.inner.lock() else { return };
        if let Some(old) = g.0.put(key.to_string(), kv) {
            g.1 -= old.bytes();
        }
        g.1 += size;
        while g.1 > self.max_bytes {
            match g.0.pop_lru() {
                Some((_, ev)) => g.1 -= ev.bytes(),
                None => break,
            }
        }
    }

    pub fn bytes(&self) -> usize {
        self.inner.lock().map(|g| g.1).unwrap_or(0)
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map(|g| g.0.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Serialize, Deserialize)]
struct Header {
    fingerprint: String,
    token_ids: Vec<u32>,
    n_layers: usize,
    n_kv_head: usize,
    head_dim: usize,
    /// Per layer, the first position stored (sliding-window layers are kept cut); absent in
    /// files written before the cut: every layer from 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    layer_starts: Vec<usize>,
    /// Per layer, head sizes and the layer whose KV it reads, where the layers differ (Gemma
    /// 4); a layer reading another's has no chunks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    head_dims: Vec<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    kv_sources: Vec<usize>,
    /// The cloud's signatures (absent: unsigned, e.g. computed at the edge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seal: Option<StoredSeal>,
}

#[derive(Serialize, Deserialize)]
struct StoredSeal {
    prompt_id: String,
    codec: String,
    first_layer: usize,
    mapped: bool,
    /// Hex, one per layer from `first_layer` on.
    signatures: Vec<String>,
}

impl StoredSeal {
    fn of(s: &Seal) -> Self {
        Self {
            prompt_id: s.prompt_id.clone(),
            codec: s.codec.name().into(),
            first_layer: s.first_layer,
            mapped: s.mapped,
            signatures: s.signatures.iter().map(hex::encode).collect(),
        }
    }

    fn seal(&self, n_layers: usize) -> Result<Seal> {
        let bad = |what: &str| KvError::Store(format!("stored seal: {what}"));
        if self.signatures.len() > n_layers || self.prompt_id.len() > 64 {
            return Err(bad("more signatures than layers"));
        }
        let signatures = self
            .signatures
            .iter()
            .map(|h| {
                let b = hex::decode(h).map_err(|_| bad("signature is not hex"))?;
                <[u8; SIGNATURE_BYTES]>::try_from(b).map_err(|_| bad("signature length"))
            })
            .collect::<Result<_>>()?;
        Ok(Seal {
            prompt_id: self.prompt_id.clone(),
            codec: Codec::parse(&self.codec).ok_or_else(|| bad("unknown codec"))?,
            first_layer: self.first_layer,
            mapped: self.mapped,
            signatures,
        })
    }
}

const MAGIC: &[u8; 6] = b"EPKV1\n";
/// Tokens per stored chunk.
const CHUNK_TOKENS: usize = 256;

/// One file per prefix under a directory; written to a temporary file and renamed, so a
/// crash leaves either the old file or the new one, never half of one. Bounded in bytes: past
/// the bound the least recently used files go (a read marks a file used).
pub struct DiskStore {
    dir: PathBuf,
    max_bytes: u64,
    /// Held while a write and its eviction run, so two writers do not both evict.
    evicting: Mutex<()>,
}

impl DiskStore {
    /// A store without a byte bound.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_bounded(dir, u64::MAX)
    }

    /// A store holding at most `max_bytes` of prefixes (older files beyond it are evicted at
    /// the next write).
    pub fn open_bounded(dir: impl AsRef<Path>, max_bytes: u64) -> Result<Self> {
        std::fs::create_dir_all(dir.as_ref())?;
        Ok(Self {
            dir: dir.as_ref().to_path_buf(),
            max_bytes,
            evicting: Mutex::new(()),
        })
    }

    /// Bytes of the prefixes stored.
    pub fn bytes(&self) -> u64 {
        self.files().iter().map(|f| f.1).sum()
    }

    /// The stored files: path, size, last use.
    fn files(&self) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        dir.filter_map(|e| {
            let e = e.ok()?;
            let p = e.path();
            if p.extension()? != "kv" {
                return None;
            }
            let m = e.metadata().ok()?;
            Some((p, m.len(), m.modified().ok()?))
        })
        .collect()
    }

    /// Remove least recently used files until the store is within its bound, never `keep`.
    fn evict(&self, keep: &Path) {
        if self.max_bytes == u64::MAX {
            return;
        }
        let mut files = self.files();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort_by_key(|f| f.2);
        for (p, len, _) in files {
            if total <= self.max_bytes {
                break;
            }
            if p != keep && std::fs::remove_file(&p).is_ok() {
                tracing::info!("disk tier: evicted {} ({len} bytes)", p.display());
                total -= len;
            }
        }
    }

    fn path(&self, key: &str) -> Result<PathBuf> {
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(KvError::Store(format!("invalid key {key:?}")));
        }
        Ok(self.dir.join(format!("{key}.kv")))
    }

    pub fn put(&self, key: &str, kv: &PrefixKv, seal: Option<&Seal>) -> Result<()> {
        let path = self.path(key)?;
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
        {
            let mut w = std::io::BufWriter::new(tmp.as_file_mut());
            write_prefix(&mut w, kv, seal)?;
            w.flush()?;
        }
        tmp.as_file().sync_all()?;
        let _g = self.evicting.lock().unwrap_or_else(|p| p.into_inner());
        tmp.persist(&path).map_err(|e| KvError::Io(e.error))?;
        self.evict(&path);
        Ok(())
    }

    /// The stored prefix and its seal, checked chunk by chunk against `expect`; `None` if
    /// absent. A damaged file is an error (and is left for inspection), never a silently wrong
    /// prefix. Whether the seal is the trusted cloud's is the caller's check.
    pub fn get(&self, key: &str, expect: &Expect) -> Result<Option<(PrefixKv, Option<Seal>)>> {
        let path = self.path(key)?;
        let store_err = |m: String| KvError::Store(format!("{}: {m}", path.display()));
        let f = match open_regular(&path) {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(None),
            Err(e) => return Err(store_err(e.to_string())),
        };
        let len = f.metadata()?.len();
        if len > expect.max_stored_bytes() {
            return Err(store_err(format!(
                "{len} bytes, more than a prefix of this model can take"
            )));
        }
        // A read is a use: the LRU order is the files' modification times.
        let _ = f.set_modified(std::time::SystemTime::now());
        let mut f = std::io::BufReader::new(f.take(len));
        read_prefix(&mut f, expect)
            .map(Some)
            .map_err(|e| KvError::Store(format!("{}: {e}", path.display())))
    }

    pub fn contains(&self, key: &str) -> bool {
        self.path(key).map(|p| p.exists()).unwrap_or(false)
    }

    /// Remove `key`'s file (KV its reader refused: signed by a key it no longer trusts).
    pub fn remove(&self, key: &str) -> Result<()> {
        let path = self.path(key)?;
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(KvError::Io(e)),
            _ => Ok(()),
        }
    }
}

/// A prefix as bytes: magic, JSON header, then sealed f16 chunks in layer-major order (the
/// format of the disk and Redis tiers).
pub fn write_prefix(w: &mut impl Write, kv: &PrefixKv, seal: Option<&Seal>) -> Result<()> {
    let first = kv.layers.first();
    let map = LayerMap::of_layers(&kv.layers);
    let header = Header {
        fingerprint: kv.fingerprint.clone(),
        token_ids: kv.token_ids.clone(),
        n_layers: kv.layers.len(),
        n_kv_head: first.map_or(0, |l| l.n_kv_head),
        head_dim: first.map_or(0, |l| l.head_dim),
        layer_starts: match kv.layers.iter().any(|l| l.start() > 0) {
            true => kv.layers.iter().map(|l| l.start()).collect(),
            false => Vec::new(),
        },
        head_dims: map.head_dims,
        kv_sources: map.kv_sources,
        seal: seal.map(StoredSeal::of),
    };
    let h = serde_json::to_vec(&header).map_err(|e| KvError::Store(e.to_string()))?;
    w.write_all(MAGIC)?;
    w.write_all(&(h.len() as u64).to_le_bytes())?;
    w.write_all(&h)?;
    for (l, layer) in kv.layers.iter().enumerate() {
        let mut s = layer.start();
        while s < layer.end() {
            let e = (s + CHUNK_TOKENS).min(layer.end());
            write_chunk(w, &Chunk::encode(l as u32, layer, s, e, Codec::F16, None)?)?;
            s = e;
        }
        // A recurrent layer: one chunk without positions, carrying its state.
        if layer.state.is_some() {
            let e = layer.end();
            write_chunk(w, &Chunk::encode(l as u32, layer, e, e, Codec::F16, None)?)?;
        }
    }
    Ok(())
}

/// Read what `write_prefix` wrote; every chunk is verified and reassembled in order, so damaged
/// or foreign bytes are an error, never a wrong prefix. Every size is bounded by `expect`
/// before it is allocated.
pub fn read_prefix(r: &mut impl Read, expect: &Expect) -> Result<(PrefixKv, Option<Seal>)> {
    let mut magic = [0u8; 6];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(KvError::Store("not a stored KV prefix".into()));
    }
    let hlen = read_u64(r)?;
    let most = expect.max_header_bytes();
    if hlen > most {
        return Err(KvError::Store(format!(
            "header of {hlen} bytes, more than {most}"
        )));
    }
    let mut h = Vec::new();
    r.take(hlen).read_to_end(&mut h)?;
    if h.len() as u64 != hlen {
        return Err(KvError::Store("header truncated".into()));
    }
    let header: Header = serde_json::from_slice(&h).map_err(|e| KvError::Store(e.to_string()))?;
    let map = LayerMap {
        head_dims: header.head_dims,
        kv_sources: header.kv_sources,
    };
    if (header.n_layers, header.n_kv_head, header.head_dim, &map)
        != (
            expect.n_layers,
            expect.n_kv_head,
            expect.head_dim,
            &expect.layers,
        )
    {
        return Err(KvError::Store(format!(
            "a KV of {} layers x {} heads x {}, this model's is {} x {} x {}",
            header.n_layers,
            header.n_kv_head,
            header.head_dim,
            expect.n_layers,
            expect.n_kv_head,
            expect.head_dim
        )));
    }
    expect.check_ids(&header.token_ids)?;
    let seal = header
        .seal
        .as_ref()
        .map(|s| s.seal(header.n_layers))
        .transpose()?;
    let n = header.token_ids.len();
    let dim = map.max_head_dim(header.head_dim);
    let most_payload =
        Codec::F16.chunk_bytes(header.n_kv_head, dim, MAX_CHUNK_TOKENS) as u64 + 4096;
    let mut re = Reassembler::new(header.n_layers, n, header.n_kv_head, header.head_dim)
        .with_codec(Codec::F16)
        .with_state(expect.state)
        .with_layers(map)?
        .with_starts(&header.layer_starts)?;
    let mut layers = Vec::with_capacity(header.n_layers);
    let mut take = |re: &mut Reassembler, done: Option<(usize, LayerKv)>| {
        layers.extend(done.into_iter().map(|(_, l)| Arc::new(l)));
        layers.extend(re.take_unowned().into_iter().map(|(_, l)| Arc::new(l)));
    };
    take(&mut re, None);
    while !re.is_complete() {
        let c = read_chunk(r, most_payload, expect.max_state_bytes())?;
        let done = re.push(&c)?;
        take(&mut re, done);
    }
    let prefix = PrefixKv {
        fingerprint: header.fingerprint,
        token_ids: header.token_ids,
        layers,
    };
    Ok((prefix, seal))
}

fn read_u64(r: &mut impl Read) -> Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn read_u32(r: &mut impl Read) -> Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn write_chunk(w: &mut impl Write, c: &Chunk) -> Result<()> {
    for x in [c.layer, c.start, c.end, c.checksum] {
        w.write_all(&x.to_le_bytes())?;
    }
    // Flags: bit 0 compressed, bit 1 a state follows the payload (files without states read
    // as before).
    let flags = c.compressed as u8 | (!c.state.is_empty() as u8) << 1;
    w.write_all(&[c.codec.id(), flags])?;
    w.write_all(&(c.payload.len() as u64).to_le_bytes())?;
    w.write_all(&c.payload)?;
    if !c.state.is_empty() {
        w.write_all(&(c.state.len() as u64).to_le_bytes())?;
        w.write_all(&c.state)?;
    }
    Ok(())
}

/// `len` bytes of `r`, at most `most`: a lying length costs what is really there.
fn read_bytes(r: &mut impl Read, most: u64, what: &str) -> Result<Vec<u8>> {
    let len = read_u64(r)?;
    if len > most {
        return Err(KvError::Store(format!(
            "a {what} of {len} bytes, more than {most}"
        )));
    }
    let mut out = Vec::new();
    r.take(len).read_to_end(&mut out)?;
    if out.len() as u64 != len {
        return Err(KvError::Store(format!("{what} truncated")));
    }
    Ok(out)
}

fn read_chunk(r: &mut impl Read, most: u64, most_state: u64) -> Result<Chunk> {
    let (layer, start, end, checksum) = (read_u32(r)?, read_u32(r)?, read_u32(r)?, read_u32(r)?);
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    let codec =
        Codec::from_id(b[0]).ok_or_else(|| KvError::Store(format!("unknown codec {}", b[0])))?;
    if b[1] > 3 {
        return Err(KvError::Store(format!("unknown chunk flags {}", b[1])));
    }
    let payload = read_bytes(r, most, "chunk")?;
    let state = match b[1] & 2 {
        0 => Vec::new(),
        _ => read_bytes(r, most_state, "state")?,
    };
    Ok(Chunk {
        layer,
        start,
        end,
        codec,
        compressed: b[1] & 1 != 0,
        payload,
        state,
        checksum,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use edgeprompt_engine::LayerKv;

    pub(crate) fn prefix(n: usize, n_layers: usize) -> PrefixKv {
        let (h, d) = (2, 16);
        let layers = (0..n_layers)
            .map(|l| {
                let mut kv = LayerKv::new(h, d);
                let k: Vec<f32> = (0..n * h * d).map(|i| (i + l) as f32 * 0.01).collect();
                kv.append(&k, &k, n);
                Arc::new(kv)
            })
            .collect();
        PrefixKv {
            fingerprint: "fp".into(),
            token_ids: (0..n as u32).collect(),
            layers,
        }
    }

    /// Window-cut layers (some starting past position 0) keep their positions through the
    /// stored format, and a reader refuses starts that do not fit the prompt.
    #[test]
    fn cut_layers_roundtrip_with_their_positions() {
        let mut p = prefix(600, 3);
        p.layers[0] = Arc::new(p.layers[0].cut_before(89));
        p.layers[2] = Arc::new(p.layers[2].cut_before(511));
        let mut bytes = Vec::new();
        write_prefix(&mut bytes, &p, None).unwrap();
        let (back, seal) = read_prefix(&mut &bytes[..], &expect(3, 600)).unwrap();
        assert!(seal.is_none());
        let starts: Vec<usize> = back.layers.iter().map(|l| l.start()).collect();
        assert_eq!(starts, [89, 0, 511]);
        assert_eq!(back.layers, p.layers);
        let re = Reassembler::new(3, 600, 2, 16);
        assert!(
            re.with_starts(&[0, 600, 0]).is_err(),
            "an empty layer is refused"
        );
        let re = Reassembler::new(3, 600, 2, 16);
        assert!(re.with_starts(&[0, 0]).is_err(), "one start per layer");
    }

    pub(crate) fn expect(n_layers: usize, max_tokens: usize) -> Expect {
        Expect {
            n_layers,
            layers: Default::default(),
            n_kv_head: 2,
            head_dim: 16,
            max_tokens,
            vocab_size: 1000,
            state: None,
        }
    }

    #[test]
    fn a_hybrid_prefix_round_trips_with_its_states_and_seal() {
        use edgeprompt_engine::recurrent::{DeltaNet, Recurrence, Recurrent};
        let shape = Recurrence::DeltaNet(DeltaNet {
            conv_kernel: 3,
            k_heads: 1,
            v_heads: 2,
            head_dim: 4,
        });
        let mut st = Recurrent::zero(&shape);
        for (i, v) in st.conv.iter_mut().chain(st.matrix.iter_mut()).enumerate() {
            *v = i as f32 * 0.25 - 3.0;
        }
        let mut p = prefix(10, 2);
        p.layers[0] = Arc::new(LayerKv::recurrent(2, 16, 10, Arc::new(st)));
        let key = crate::SealKey::from_seed([9; 32]);
        let seal = Seal::sign(&key, "doc", &p, Codec::F16, 0, false);
        let mut bytes = Vec::new();
        write_prefix(&mut bytes, &p, Some(&seal)).unwrap();
        let want = Expect {
            state: Some(shape),
            ..expect(2, 100)
        };
        let (back, seal_back) = read_prefix(&mut &bytes[..], &want).unwrap();
        assert_eq!(back.layers[0], p.layers[0]);
        assert_eq!(back.layers[1], p.layers[1]);
        seal_back.unwrap().verify(&key.public(), &back).unwrap();
        // A reader whose model has no such state refuses it; a flipped state byte fails the CRC.
        assert!(read_prefix(&mut &bytes[..], &expect(2, 100)).is_err());
        let at = bytes.len() - p.layers[1].bytes() - 40;
        let mut bad = bytes.clone();
        bad[at] ^= 1;
        assert!(read_prefix(&mut &bad[..], &want).is_err());
    }

    /// Gemma 4's layout: layers of two head sizes, the last two reading layers 1 and 2's KV.
    /// Stored with no chunk for those two, read back with them, its seal signing the three
    /// that own KV; a reader whose model's layers differ refuses the file.
    #[test]
    fn a_prefix_of_shared_layers_round_trips_without_their_kv() {
        let n = 20;
        let layer = |d: usize, l: usize| {
            let mut kv = LayerKv::new(2, d);
            let k: Vec<f32> = (0..n * 2 * d).map(|i| (i + l) as f32 * 0.01).collect();
            kv.append(&k, &k, n);
            Arc::new(kv)
        };
        let p = PrefixKv {
            fingerprint: "fp".into(),
            token_ids: (0..n as u32).collect(),
            layers: vec![
                layer(8, 0),
                Arc::new(layer(8, 1).cut_before(12)),
                layer(16, 2),
                Arc::new(LayerKv::reading(2, 8, n, 1)),
                Arc::new(LayerKv::reading(2, 16, n, 2)),
            ],
        };
        let key = crate::SealKey::from_seed([3; 32]);
        let seal = Seal::sign(&key, "doc", &p, Codec::F16, 0, false);
        assert_eq!(
            seal.signatures.len(),
            3,
            "only the layers that own KV are signed"
        );
        let mut bytes = Vec::new();
        write_prefix(&mut bytes, &p, Some(&seal)).unwrap();
        let layers = LayerMap {
            head_dims: vec![8, 8, 16, 8, 16],
            kv_sources: vec![0, 1, 2, 1, 2],
        };
        let want = Expect {
            n_layers: 5,
            head_dim: 8,
            layers: layers.clone(),
            ..expect(5, 100)
        };
        let (back, seal_back) = read_prefix(&mut &bytes[..], &want).unwrap();
        assert_eq!(back.layers, p.layers);
        seal_back.unwrap().verify(&key.public(), &back).unwrap();
        // The shared layers take no bytes: the file is the three owned layers' and framing.
        let owned: usize = p.layers.iter().map(|l| l.bytes()).sum();
        assert!(
            bytes.len() < owned + 2048,
            "{} bytes for {owned}",
            bytes.len()
        );
        // A model whose last layer owns its KV, or without the map, refuses the file.
        let mut owns = layers.clone();
        owns.kv_sources[4] = 4;
        for m in [owns, LayerMap::default()] {
            let other = Expect {
                layers: m,
                ..want.clone()
            };
            assert!(read_prefix(&mut &bytes[..], &other).is_err());
        }
    }

    #[test]
    fn memory_store_evicts_by_bytes_lru() {
        let p = Arc::new(prefix(10, 2)); // 2 layers x 10 tok x 2 heads x 16 x 2 (K,V) x 2 B
        let one = p.bytes();
        let s = MemoryStore::new(2 * one + 1);
        s.put("a", p.clone());
        s.put("b", p.clone());
        assert!(s.get("a").is_some()); // a is now most recent
        s.put("c", p.clone());
        assert!(s.get("b").is_none(), "least recently used is evicted");
        assert!(s.get("a").is_some() && s.get("c").is_some());
        assert_eq!(s.bytes(), 2 * one);
        s.put("huge", Arc::new(prefix(100, 2)));
        assert!(s.get("huge").is_none());
    }

    #[test]
    fn disk_store_stays_within_its_bytes_evicting_the_least_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let p = prefix(100, 2);
        let e = expect(2, 100);
        let one = {
            let s = DiskStore::open(dir.path()).unwrap();
            s.put("probe", &p, None).unwrap();
            let b = s.bytes();
            std::fs::remove_file(dir.path().join("probe.kv")).unwrap();
            b
        };
        let s = DiskStore::open_bounded(dir.path(), 2 * one + one / 2).unwrap();
        let at = |secs| std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        s.put("a", &p, None).unwrap();
        s.put("b", &p, None).unwrap();
        // Times set by hand: the file system's clock may not tick between two writes.
        let touch = |k: &str, t| {
            let f = std::fs::File::options()
                .write(true)
                .open(dir.path().join(format!("{k}.kv")))
                .unwrap();
            f.set_modified(at(t)).unwrap();
        };
        touch("a", 100);
        touch("b", 200);
        // Reading "a" makes it the most recently used.
        assert!(s.get("a", &e).unwrap().is_some());
        s.put("c", &p, None).unwrap();
        assert!(
            s.get("b", &e).unwrap().is_none(),
            "least recently used evicted"
        );
        assert!(s.get("a", &e).unwrap().is_some() && s.get("c", &e).unwrap().is_some());
        assert!(s.bytes() <= 2 * one + one / 2);
    }

    /// A header that claims more than the model allows is refused before its claims are
    /// allocated; so is a stored seal that is not one.
    #[test]
    fn stored_headers_past_the_model_are_refused() {
        let p = prefix(50, 2);
        let mut bytes = Vec::new();
        write_prefix(&mut bytes, &p, None).unwrap();
        // Another shape, a longer prompt than the context, an id past the vocabulary.
        assert!(read_prefix(&mut &bytes[..], &expect(3, 50)).is_err());
        assert!(read_prefix(&mut &bytes[..], &expect(2, 49)).is_err());
        let small_vocab = Expect {
            vocab_size: 49,
            ..expect(2, 50)
        };
        assert!(read_prefix(&mut &bytes[..], &small_vocab).is_err());
        // A header length of 2^60.
        let mut huge = bytes.clone();
        huge[6..14].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(read_prefix(&mut &huge[..], &expect(2, 50)).is_err());
        assert!(read_prefix(&mut &bytes[..], &expect(2, 50)).is_ok());
    }

    #[test]
    fn disk_store_roundtrips_survives_reopen_and_detects_damage() {
        let dir = tempfile::tempdir().unwrap();
        let p = prefix(300, 3); // two chunks per layer
        let e = expect(3, 300);
        {
            let s = DiskStore::open(dir.path()).unwrap();
            assert!(s.get("k1", &e).unwrap().is_none());
            s.put("k1", &p, None).unwrap();
        }
        let s = DiskStore::open(dir.path()).unwrap();
        let (got, _) = s.get("k1", &e).unwrap().unwrap();
        assert_eq!(got.token_ids, p.token_ids);
        assert_eq!(got.layers, p.layers);
        // No temporary files are left behind.
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(files.len(), 1);
        // Flip one payload byte near the end: the checksum catches it.
        let path = dir.path().join("k1.kv");
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 3] ^= 0x40;
        std::fs::write(&path, bytes).unwrap();
        assert!(s.get("k1", &e).is_err());
        assert!(s.get("../etc/passwd", &e).is_err());
    }
}
