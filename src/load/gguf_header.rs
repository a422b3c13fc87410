//! Just enough of the GGUF header for what candle's reader does not do: say
//! which tensor stops a file from loading (candle refuses a block type it
//! does not know without naming the tensor or the type), and find the
//! MXFP4 tensors it refuses, which wick reads itself.

use std::io::{self, Read};

/// GGML's id of MXFP4, gpt-oss's expert format.
const MXFP4: u32 = 39;

/// GGML's block type names by id, as llama.cpp numbers them.
fn type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return None,
    })
}

/// The block types wick reads: candle's, and MXFP4.
const READABLE: [u32; 16] = [0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 30, MXFP4];

/// The first tensor whose block type wick cannot read, as one line naming
/// it and the type; `None` if every tensor's type is readable (or the header
/// itself is not a GGUF header).
pub fn unreadable_tensor(r: &mut impl Read) -> Option<String> {
    let (_, tensors) = tensor_types(r)?;
    let t = tensors.iter().find(|t| !READABLE.contains(&t.kind))?;
    let kind = t.kind;
    let what = type_name(kind).map_or(format!("type {kind}"), |n| format!("{n} (type {kind})"));
    Some(format!(
        "tensor {} is {what}, which wick cannot read; it reads F32, F16, BF16, Q4_0, Q4_1, \
         Q5_0, Q5_1, Q8_0, Q2_K to Q6_K and MXFP4 (re-quantize the file with llama-quantize, \
         e.g. to Q4_K_M)",
        t.name
    ))
}

/// A header with MXFP4 tensors, made readable by candle: its bytes with
/// those tensors' block type rewritten to F32 (their shapes and offsets
/// stay right; wick reads their data itself), and their names. `None` when
/// the header has none (or is not a GGUF header).
pub fn mask_mxfp4(r: &mut impl Read) -> Option<(Vec<u8>, Vec<String>)> {
    let (mut bytes, tensors) = tensor_types(r)?;
    let mxfp4: Vec<&TensorType> = tensors.iter().filter(|t| t.kind == MXFP4).collect();
    if mxfp4.is_empty() {
        return None;
    }
    for t in &mxfp4 {
        bytes[t.at..t.at + 4].copy_from_slice(&0u32.to_le_bytes());
    }
    Some((bytes, mxfp4.iter().map(|t| t.name.clone()).collect()))
}

/// A tensor's name and block type, and where the type lies in the header.
struct TensorType {
    name: String,
    kind: u32,
    at: usize,
}

/// The header's bytes (through the tensor infos) and each tensor's block
/// type; `None` if it is not a GGUF (v2 or v3) header.
fn tensor_types(r: &mut impl Read) -> Option<(Vec<u8>, Vec<TensorType>)> {
    let mut h = Header {
        r: &mut Recorder {
            r,
            bytes: Vec::new(),
        },
    };
    if &h.bytes::<4>().ok()? != b"GGUF" || h.u32().ok()? < 2 {
        return None;
    }
    let tensors = h.u64().ok()?;
    let kvs = h.u64().ok()?;
    for _ in 0..kvs {
        h.string().ok()?;
        let kind = h.u32().ok()?;
        h.skip_value(kind).ok()?;
    }
    let mut types = Vec::new();
    for _ in 0..tensors {
        let name = h.string().ok()?;
        let dims = h.u32().ok()?;
        for _ in 0..dims {
            h.u64().ok()?;
        }
        let at = h.r.bytes.len();
        let kind = h.u32().ok()?;
        h.u64().ok()?;
        types.push(TensorType { name, kind, at });
    }
    Some((std::mem::take(&mut h.r.bytes), types))
}

/// A reader that keeps a copy of what it reads.
struct Recorder<'a, R: Read> {
    r: &'a mut R,
    bytes: Vec<u8>,
}

impl<R: Read> Read for Recorder<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.r.read(buf)?;
        self.bytes.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

struct Header<'a, R: Read> {
    r: &'a mut R,
}

impl<R: Read> Header<'_, R> {
    fn bytes<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let mut b = [0; N];
        self.r.read_exact(&mut b)?;
        Ok(b)
    }

    fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    fn skip(&mut self, n: u64) -> io::Result<()> {
        io::copy(&mut self.r.take(n), &mut io::sink())?;
        Ok(())
    }

    fn string(&mut self) -> io::Result<String> {
        let len = self.u64()?;
        // A name is short; a huge length means this is not a header we read.
        if len > 1 << 20 {
            return Err(io::ErrorKind::InvalidData.into());
        }
        let mut s = vec![0; len as usize];
        self.r.read_exact(&mut s)?;
        Ok(String::from_utf8_lossy(&s).into_owned())
    }

    /// Skips one metadata value of GGUF value type `kind`.
    fn skip_value(&mut self, kind: u32) -> io::Result<()> {
        match kind {
            0 | 1 | 7 => self.skip(1),
            2 | 3 => self.skip(2),
            4..=6 => self.skip(4),
            10..=12 => self.skip(8),
            8 => self.string().map(drop),
            9 => {
                let item = self.u32()?;
                let n = self.u64()?;
                for _ in 0..n {
                    self.skip_value(item)?;
                }
                Ok(())
            }
            _ => Err(io::ErrorKind::InvalidData.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header with one string and one array key, then `types` tensors.
    fn header(types: &[u32]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((types.len() as u64).to_le_bytes());
        b.extend(2u64.to_le_bytes());
        let string = |b: &mut Vec<u8>, s: &str| {
            b.extend((s.len() as u64).to_le_bytes());
            b.extend(s.as_bytes());
        };
        string(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        string(&mut b, "llama");
        string(&mut b, "tokenizer.ggml.scores");
        b.extend(9u32.to_le_bytes());
        b.extend(6u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend([0u8; 8]);
        for (i, &t) in types.iter().enumerate() {
            string(&mut b, &format!("blk.{i}.w"));
            b.extend(2u32.to_le_bytes());
            b.extend(32u64.to_le_bytes());
            b.extend(4u64.to_le_bytes());
            b.extend(t.to_le_bytes());
            b.extend(0u64.to_le_bytes());
        }
        b
    }

    #[test]
    fn names_the_first_unreadable_tensor_and_its_type() {
        let msg = unreadable_tensor(&mut &header(&[2, 12, 20, 23])[..]).unwrap();
        assert!(
            msg.starts_with("tensor blk.2.w is IQ4_NL (type 20)"),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
        assert!(unreadable_tensor(&mut &header(&[0, 1, 14, 30])[..]).is_none());
        assert!(unreadable_tensor(&mut &b"not a gguf"[..]).is_none());
        assert!(unreadable_tensor(&mut &header(&[0, MXFP4])[..]).is_none());
    }

    /// MXFP4 tensors' types become F32's, nothing else changes, and candle
    /// reads the result.
    #[test]
    fn masks_mxfp4_tensors_for_candle() {
        let original = header(&[0, MXFP4, 8, MXFP4]);
        let (masked, names) = mask_mxfp4(&mut &original[..]).unwrap();
        assert_eq!(names, ["blk.1.w", "blk.3.w"]);
        assert_eq!(masked.len(), original.len());
        let changed: Vec<usize> = (0..masked.len())
            .filter(|&i| masked[i] != original[i])
            .collect();
        assert_eq!(changed.len(), 2, "one byte of each type field");
        let mut file = masked.clone();
        file.resize(file.len().next_multiple_of(32) + 4 * 32 * 4, 0);
        let content =
            candle_core::quantized::gguf_file::Content::read(&mut io::Cursor::new(file)).unwrap();
        assert_eq!(content.tensor_infos.len(), 4);
        assert!(mask_mxfp4(&mut &header(&[0, 8])[..]).is_none());
    }
}
