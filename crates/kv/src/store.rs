//! Where cloud-prompt KV lives between requests: a bytes-bounded in-memory LRU and a local disk
//! store (atomic writes, checksummed, survives restarts), both keyed by content address.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use edgeprompt_engine::PrefixKv;
use lru::LruCache;
use serde::{Deserialize, Serialize};

use crate::chunk::{Chunk, Reassembler};
use crate::codec::Codec;
use crate::{KvError, Result};

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
}

const MAGIC: &[u8; 6] = b"EPKV1\n";
/// Tokens per stored chunk.
const CHUNK_TOKENS: usize = 256;

/// One file per prefix under a directory; written to a temporary file and renamed, so a
/// crash leaves either the old file or the new one, never half of one.
pub struct DiskStore {
    dir: PathBuf,
}

impl DiskStore {
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        std::fs::create_dir_all(dir.as_ref())?;
        Ok(Self {
            dir: dir.as_ref().to_path_buf(),
        })
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

    pub fn put(&self, key: &str, kv: &PrefixKv) -> Result<()> {
        let path = self.path(key)?;
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
        {
            let mut w = std::io::BufWriter::new(tmp.as_file_mut());
            write_prefix(&mut w, kv)?;
            w.flush()?;
        }
        tmp.as_file().sync_all()?;
        tmp.persist(&path).map_err(|e| KvError::Io(e.error))?;
        Ok(())
    }

    /// The stored prefix, verified chunk by chunk; `None` if absent. A damaged file is an
    /// error (and is left for inspection), never a silently wrong prefix.
    pub fn get(&self, key: &str) -> Result<Option<PrefixKv>> {
        let path = self.path(key)?;
        let mut f = match std::fs::File::open(&path) {
            Ok(f) => std::io::BufReader::new(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        read_prefix(&mut f)
            .map(Some)
            .map_err(|e| KvError::Store(format!("{}: {e}", path.display())))
    }

    pub fn contains(&self, key: &str) -> bool {
        self.path(key).map(|p| p.exists()).unwrap_or(false)
    }
}

/// A prefix as bytes: magic, JSON header, then sealed f16 chunks in layer-major order (the
/// format of the disk and Redis tiers).
pub fn write_prefix(w: &mut impl Write, kv: &PrefixKv) -> Result<()> {
    let first = kv.layers.first();
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
    }
    Ok(())
}

/// Read what `write_prefix` wrote; every chunk is verified and reassembled in order, so damaged
/// or foreign bytes are an error, never a wrong prefix.
pub fn read_prefix(r: &mut impl Read) -> Result<PrefixKv> {
    let mut magic = [0u8; 6];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(KvError::Store("not a stored KV prefix".into()));
    }
    let hlen = read_u64(r)? as usize;
    if hlen > 64 << 20 {
        return Err(KvError::Store("header too large".into()));
    }
    let mut h = vec![0u8; hlen];
    r.read_exact(&mut h)?;
    let header: Header = serde_json::from_slice(&h).map_err(|e| KvError::Store(e.to_string()))?;
    if header.n_layers > 4096 || header.n_kv_head > 4096 || header.head_dim > 4096 {
        return Err(KvError::Store("implausible KV shape".into()));
    }
    let n = header.token_ids.len();
    let mut re = Reassembler::new(header.n_layers, n, header.n_kv_head, header.head_dim)
        .with_starts(&header.layer_starts)?;
    let mut layers = Vec::with_capacity(header.n_layers);
    while !re.is_complete() {
        let c = read_chunk(r)?;
        if let Some((_, layer)) = re.push(&c)? {
            layers.push(Arc::new(layer));
        }
    }
    Ok(PrefixKv {
        fingerprint: header.fingerprint,
        token_ids: header.token_ids,
        layers,
    })
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
    w.write_all(&[c.codec.id(), c.compressed as u8])?;
    w.write_all(&(c.payload.len() as u64).to_le_bytes())?;
    w.write_all(&c.payload)?;
    Ok(())
}

fn read_chunk(r: &mut impl Read) -> Result<Chunk> {
    let (layer, start, end, checksum) = (read_u32(r)?, read_u32(r)?, read_u32(r)?, read_u32(r)?);
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    let codec =
        Codec::from_id(b[0]).ok_or_else(|| KvError::Store(format!("unknown codec {}", b[0])))?;
    let len = read_u64(r)?;
    if len > 64 << 20 {
        return Err(KvError::Store("chunk too large".into()));
    }
    // Read through `take`: a lying length costs what is really there, not what it claims.
    let mut payload = Vec::new();
    r.take(len).read_to_end(&mut payload)?;
    if payload.len() as u64 != len {
        return Err(KvError::Store("chunk truncated".into()));
    }
    Ok(Chunk {
        layer,
        start,
        end,
        codec,
        compressed: b[1] != 0,
        payload,
        checksum,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgeprompt_engine::LayerKv;

    fn prefix(n: usize, n_layers: usize) -> PrefixKv {
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
        write_prefix(&mut bytes, &p).unwrap();
        let back = read_prefix(&mut &bytes[..]).unwrap();
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
    fn disk_store_roundtrips_survives_reopen_and_detects_damage() {
        let dir = tempfile::tempdir().unwrap();
        let p = prefix(300, 3); // two chunks per layer
        {
            let s = DiskStore::open(dir.path()).unwrap();
            assert!(s.get("k1").unwrap().is_none());
            s.put("k1", &p).unwrap();
        }
        let s = DiskStore::open(dir.path()).unwrap();
        let got = s.get("k1").unwrap().unwrap();
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
        assert!(s.get("k1").is_err());
        assert!(s.get("../etc/passwd").is_err());
    }
}
