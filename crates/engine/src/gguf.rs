//! The GGUF container: metadata and where each tensor's bytes are. A model file is untrusted
//! input, so every count and length is checked against the bytes left in the file before
//! anything is allocated for it.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};

use crate::{EngineError, Result};

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn to_u32(&self) -> Option<u32> {
        self.to_i64().and_then(|v| u32::try_from(v).ok())
    }

    pub fn to_i32(&self) -> Option<i32> {
        self.to_i64().and_then(|v| i32::try_from(v).ok())
    }

    /// Any integer value (a u64 above `i64::MAX` is none).
    pub fn to_i64(&self) -> Option<i64> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => i64::try_from(v).ok()?,
            Value::I64(v) => v,
            _ => return None,
        })
    }

    pub fn to_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn to_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
}

/// A tensor's element type, as ggml numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    IQ4NL,
    IQ4XS,
    /// A type this reader knows by number only (other i-quants, ternary, integer tensors):
    /// its size is unknown, so no tensor of it can be used.
    Other(u32),
}

impl Dtype {
    fn from_u32(t: u32) -> Self {
        match t {
            0 => Dtype::F32,
            1 => Dtype::F16,
            2 => Dtype::Q4_0,
            3 => Dtype::Q4_1,
            6 => Dtype::Q5_0,
            7 => Dtype::Q5_1,
            8 => Dtype::Q8_0,
            9 => Dtype::Q8_1,
            10 => Dtype::Q2K,
            11 => Dtype::Q3K,
            12 => Dtype::Q4K,
            13 => Dtype::Q5K,
            14 => Dtype::Q6K,
            15 => Dtype::Q8K,
            20 => Dtype::IQ4NL,
            23 => Dtype::IQ4XS,
            30 => Dtype::BF16,
            t => Dtype::Other(t),
        }
    }

    /// Values per block and bytes per block.
    pub fn block(self) -> Option<(usize, usize)> {
        Some(match self {
            Dtype::F32 => (1, 4),
            Dtype::F16 | Dtype::BF16 => (1, 2),
            Dtype::Q4_0 => (32, 18),
            Dtype::Q4_1 => (32, 20),
            Dtype::Q5_0 => (32, 22),
            Dtype::Q5_1 => (32, 24),
            Dtype::Q8_0 => (32, 34),
            Dtype::Q8_1 => (32, 36),
            Dtype::Q2K => (256, 84),
            Dtype::Q3K => (256, 110),
            Dtype::Q4K => (256, 144),
            Dtype::Q5K => (256, 176),
            Dtype::Q6K => (256, 210),
            Dtype::Q8K => (256, 292),
            Dtype::IQ4NL => (32, 18),
            Dtype::IQ4XS => (256, 136),
            Dtype::Other(_) => return None,
        })
    }

    /// Bytes of `values` values (whole blocks only).
    pub fn bytes(self, values: usize) -> Option<usize> {
        let (per, bytes) = self.block()?;
        values
            .is_multiple_of(per)
            .then(|| (values / per).checked_mul(bytes))?
    }
}

impl std::fmt::Display for Dtype {
    /// llama.cpp's name for the type.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Dtype::Q2K => "Q2_K",
            Dtype::Q3K => "Q3_K",
            Dtype::Q4K => "Q4_K",
            Dtype::Q5K => "Q5_K",
            Dtype::Q6K => "Q6_K",
            Dtype::Q8K => "Q8_K",
            Dtype::IQ4NL => "IQ4_NL",
            Dtype::IQ4XS => "IQ4_XS",
            Dtype::Other(t) => match t {
                16 => "IQ2_XXS",
                17 => "IQ2_XS",
                18 => "IQ3_XXS",
                19 => "IQ1_S",
                21 => "IQ3_S",
                22 => "IQ2_S",
                24 => "I8",
                25 => "I16",
                26 => "I32",
                27 => "I64",
                28 => "F64",
                29 => "IQ1_M",
                34 => "TQ1_0",
                35 => "TQ2_0",
                39 => "MXFP4",
                t => return write!(f, "type {t}"),
            },
            other => return write!(f, "{other:?}"),
        };
        f.write_str(name)
    }
}

/// Where a tensor is and what it holds. `dims` outermost first: a matrix of `n` rows of `k`
/// values is `[n, k]` (GGUF stores them innermost first).
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub dims: Vec<usize>,
    pub dtype: Dtype,
    /// From the start of the tensor data.
    pub offset: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> Option<usize> {
        self.dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
    }

    /// `(rows, columns)` of a matrix.
    pub fn dims2(&self) -> Option<(usize, usize)> {
        match self.dims[..] {
            [n, k] => Some((n, k)),
            _ => None,
        }
    }
}

/// A GGUF file's header: metadata, tensors, and where their data starts.
#[derive(Debug, Default)]
pub struct Content {
    pub metadata: HashMap<String, Value>,
    pub tensor_infos: HashMap<String, TensorInfo>,
    pub tensor_data_offset: u64,
}

const MAGIC: &[u8; 4] = b"GGUF";
/// Arrays in arrays: deeper nesting is refused (no model uses it).
const MAX_DEPTH: usize = 2;
const MAX_DIMS: usize = 4;

/// Reads with a running count of the bytes left in the file, so no length read from it can
/// ask for more than it holds.
struct Reader<R> {
    r: R,
    left: u64,
}

fn bad(what: impl std::fmt::Display) -> EngineError {
    EngineError::Gguf(what.to_string())
}

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        if self.left < N as u64 {
            return Err(bad("the file ends inside its header"));
        }
        self.r
            .read_exact(&mut b)
            .map_err(|e| bad(format!("reading the header: {e}")))?;
        self.left -= N as u64;
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    /// A count of items of at least `min` bytes each, checked against the bytes left.
    fn count(&mut self, min: u64, what: &str) -> Result<usize> {
        let n = self.u64()?;
        if n.saturating_mul(min) > self.left {
            return Err(bad(format!("{what}: {n} items cannot fit in the file")));
        }
        usize::try_from(n).map_err(|_| bad(format!("{what}: {n} items")))
    }

    fn string(&mut self) -> Result<String> {
        let n = self.count(1, "a string")?;
        let mut b = vec![0u8; n];
        self.r
            .read_exact(&mut b)
            .map_err(|e| bad(format!("reading the header: {e}")))?;
        self.left -= n as u64;
        // Lossy: a vocabulary may hold byte pieces that are not UTF-8 on their own.
        Ok(String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into()))
    }

    fn value(&mut self, kind: u32, depth: usize) -> Result<Value> {
        Ok(match kind {
            0 => Value::U8(u8::from_le_bytes(self.bytes()?)),
            1 => Value::I8(i8::from_le_bytes(self.bytes()?)),
            2 => Value::U16(u16::from_le_bytes(self.bytes()?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.bytes()?)),
            6 => Value::F32(f32::from_le_bytes(self.bytes()?)),
            7 => Value::Bool(u8::from_le_bytes(self.bytes()?) != 0),
            8 => Value::String(self.string()?),
            9 if depth < MAX_DEPTH => {
                let inner = self.u32()?;
                let min = match inner {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    _ => 8,
                };
                let n = self.count(min, "an array")?;
                // Grown as read: a value in memory is larger than its bytes in the file.
                let mut v = Vec::with_capacity(n.min(4096));
                for _ in 0..n {
                    v.push(self.value(inner, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.bytes()?)),
            12 => Value::F64(f64::from_le_bytes(self.bytes()?)),
            k => return Err(bad(format!("metadata value of unknown type {k}"))),
        })
    }
}

impl Content {
    /// The header of a GGUF (version 2 or 3) of `len` bytes, `r` at its start; `r` is left
    /// where the header ends.
    pub fn read<R: Read + Seek>(r: &mut R, len: u64) -> Result<Self> {
        let mut rd = Reader { r, left: len };
        if &rd.bytes::<4>()? != MAGIC {
            return Err(bad("not a GGUF file"));
        }
        let version = rd.u32()?;
        if !(2..=3).contains(&version) {
            return Err(bad(format!("GGUF version {version} (2 and 3 are read)")));
        }
        let tensors = rd.count(24, "tensors")?;
        let entries = rd.count(12, "metadata")?;
        let mut metadata = HashMap::with_capacity(entries.min(4096));
        for _ in 0..entries {
            let key = rd.string()?;
            let kind = rd.u32()?;
            let v = rd.value(kind, 0)?;
            if metadata.contains_key(&key) {
                return Err(bad(format!("metadata key {key} appears twice")));
            }
            metadata.insert(key, v);
        }
        let mut tensor_infos = HashMap::with_capacity(tensors.min(4096));
        for _ in 0..tensors {
            let name = rd.string()?;
            let n_dims = rd.u32()? as usize;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(bad(format!("tensor {name}: {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                let d = usize::try_from(rd.u64()?)
                    .ok()
                    .filter(|&d| d > 0)
                    .ok_or_else(|| bad(format!("tensor {name}: a dimension of 0 or too large")))?;
                dims.push(d);
            }
            dims.reverse();
            let dtype = Dtype::from_u32(rd.u32()?);
            let offset = rd.u64()?;
            let info = TensorInfo {
                dims,
                dtype,
                offset,
            };
            if info.elements().is_none() {
                return Err(bad(format!("tensor {name}: too many values")));
            }
            if tensor_infos.contains_key(&name) {
                return Err(bad(format!("tensor {name} appears twice")));
            }
            tensor_infos.insert(name, info);
        }
        let align = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.to_u32() {
                Some(a) if a.is_power_of_two() => a as u64,
                _ => return Err(bad(format!("general.alignment {v:?}"))),
            },
        };
        let at =
            rd.r.stream_position()
                .map_err(|e| bad(format!("reading the header: {e}")))?;
        let tensor_data_offset = at.div_ceil(align) * align;
        let content = Self {
            metadata,
            tensor_infos,
            tensor_data_offset,
        };
        content.check_extents(len, align)?;
        rd.r.seek(SeekFrom::Start(at))
            .map_err(|e| bad(format!("reading the header: {e}")))?;
        Ok(content)
    }

    /// Every tensor of a known type lies inside the file, in rows of whole blocks (a row that
    /// split a block would be read askew).
    /// No two tensors share bytes and each starts aligned, so the weights in memory are
    /// bounded by the file's length.
    fn check_extents(&self, len: u64, align: u64) -> Result<()> {
        let mut spans = Vec::with_capacity(self.tensor_infos.len());
        for (name, t) in &self.tensor_infos {
            let row = t.dims.last().copied().unwrap_or(0);
            let whole = t.dtype.block().is_none() || t.dtype.bytes(row).is_some();
            let bytes = t
                .elements()
                .and_then(|n| t.dtype.bytes(n))
                .filter(|_| whole);
            let Some(bytes) = bytes else {
                if t.dtype.block().is_some() {
                    return Err(bad(format!("tensor {name}: rows of partial blocks")));
                }
                continue;
            };
            let end = self
                .tensor_data_offset
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(bytes as u64));
            if end.is_none_or(|e| e > len) {
                return Err(bad(format!("tensor {name} lies past the end of the file")));
            }
            if t.offset % align != 0 {
                return Err(bad(format!(
                    "tensor {name} is not aligned to {align} bytes"
                )));
            }
            spans.push((t.offset, t.offset + bytes as u64, name));
        }
        spans.sort();
        for w in spans.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(bad(format!("tensors {} and {} overlap", w[0].2, w[1].2)));
            }
        }
        Ok(())
    }
}

/// Metadata readers: a key's value, refused by name when missing or of another type.
pub(crate) fn meta<'a>(content: &'a Content, key: &str) -> Result<&'a Value> {
    content
        .metadata
        .get(key)
        .ok_or_else(|| EngineError::Gguf(format!("missing metadata key {key}")))
}

pub(crate) fn meta_str(content: &Content, key: &str) -> Result<String> {
    meta(content, key)?
        .to_str()
        .map(str::to_owned)
        .ok_or_else(|| EngineError::Gguf(format!("{key}: not a string")))
}

pub(crate) fn meta_usize(content: &Content, key: &str) -> Result<usize> {
    let v = meta(content, key)?;
    let n = match v {
        Value::U8(x) => *x as u64,
        Value::U16(x) => *x as u64,
        Value::U32(x) => *x as u64,
        Value::U64(x) => *x,
        Value::I32(x) if *x >= 0 => *x as u64,
        Value::I64(x) if *x >= 0 => *x as u64,
        other => return Err(EngineError::Gguf(format!("{key}: not a count: {other:?}"))),
    };
    Ok(n as usize)
}

pub(crate) fn meta_f32(content: &Content, key: &str) -> Result<f32> {
    match meta(content, key)? {
        Value::F32(x) => Ok(*x),
        Value::F64(x) => Ok(*x as f32),
        other => Err(EngineError::Gguf(format!("{key}: not a float: {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn string(b: &mut Vec<u8>, s: &str) {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    }

    /// A GGUF with one u32, one string array and one 2x32 Q8_0 tensor.
    fn file() -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        string(&mut b, "a.n");
        b.extend(4u32.to_le_bytes());
        b.extend(7u32.to_le_bytes());
        string(&mut b, "a.list");
        b.extend(9u32.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        string(&mut b, "x");
        string(&mut b, "yz");
        string(&mut b, "w");
        b.extend(2u32.to_le_bytes());
        b.extend(32u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
        b.extend([0u8; 68]);
        b
    }

    #[test]
    fn reads_metadata_and_tensors() {
        let b = file();
        let c = Content::read(&mut Cursor::new(&b), b.len() as u64).unwrap();
        assert_eq!(c.metadata["a.n"].to_u32(), Some(7));
        assert_eq!(
            c.metadata["a.list"],
            Value::Array(vec![Value::String("x".into()), Value::String("yz".into())])
        );
        let w = &c.tensor_infos["w"];
        assert_eq!((w.dims2(), w.dtype), (Some((2, 32)), Dtype::Q8_0));
        assert_eq!(c.tensor_data_offset as usize, b.len() - 68);
    }

    #[test]
    fn every_truncation_and_lie_is_an_error() {
        let b = file();
        for cut in 0..b.len() - 1 {
            assert!(Content::read(&mut Cursor::new(&b[..cut]), cut as u64).is_err());
        }
        // Rows of half a Q8_0 block (2 x 16 values: one block in all) are refused.
        let mut b = file();
        let dims = b
            .windows(16)
            .position(|w| w[..8] == 32u64.to_le_bytes() && w[8..] == 2u64.to_le_bytes());
        let d = dims.expect("the tensor's dims");
        b[d..d + 8].copy_from_slice(&16u64.to_le_bytes());
        assert!(Content::read(&mut Cursor::new(&b), b.len() as u64).is_err());
        // A dimension of 0 is refused.
        let mut b = file();
        b[d + 8..d + 16].copy_from_slice(&0u64.to_le_bytes());
        assert!(Content::read(&mut Cursor::new(&b), b.len() as u64).is_err());
        // Counts and lengths far beyond the file are refused before anything is allocated.
        for (at, v) in [(8, u64::MAX), (16, 1 << 40), (24, u64::MAX / 2)] {
            let mut b = file();
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            assert!(Content::read(&mut Cursor::new(&b), b.len() as u64).is_err());
        }
    }
}
