//! A GGUF file's header as the model constructors read it: candle's
//! [`Content`], and the MXFP4 tensors candle cannot hold, which
//! [`read_tensor`] reads as the Q8_0 tensors of the same values
//! ([`crate::quant::mxfp4`]).

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Deref;

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::QTensor;
use candle_core::{Device, Shape};

use crate::quant::mxfp4;

pub struct Gguf {
    content: Content,
    mxfp4: HashMap<String, Mxfp4Tensor>,
}

/// Where an MXFP4 tensor's blocks lie.
pub struct Mxfp4Tensor {
    pub shape: Shape,
    /// From the start of the tensor data.
    pub offset: u64,
}

impl Deref for Gguf {
    type Target = Content;

    fn deref(&self) -> &Content {
        &self.content
    }
}

impl From<Content> for Gguf {
    fn from(content: Content) -> Self {
        Gguf {
            content,
            mxfp4: HashMap::new(),
        }
    }
}

impl Gguf {
    /// `content` as candle read a header whose MXFP4 tensors `names` were
    /// masked as F32 ones: those move to wick's own table.
    pub fn with_mxfp4(mut content: Content, names: &[String]) -> Self {
        let mxfp4 = names
            .iter()
            .filter_map(|n| {
                let info = content.tensor_infos.remove(n)?;
                Some((
                    n.clone(),
                    Mxfp4Tensor {
                        shape: info.shape,
                        offset: info.offset,
                    },
                ))
            })
            .collect();
        Gguf { content, mxfp4 }
    }

    /// One header for a GGUF split in parts laid end to end (`starts[k]`:
    /// where part `k` begins, `first` being part 0): the first part's
    /// metadata, and every part's tensors with their offsets moved onto
    /// the joined file (`load::gguf_split`).
    pub fn merge(mut first: Gguf, rest: Vec<Gguf>, starts: &[u64]) -> Gguf {
        let base = first.content.tensor_data_offset;
        for (part, start) in rest.into_iter().zip(&starts[1..]) {
            let shift = start + part.content.tensor_data_offset - base;
            for (name, mut info) in part.content.tensor_infos {
                info.offset += shift;
                first.content.tensor_infos.insert(name, info);
            }
            for (name, mut t) in part.mxfp4 {
                t.offset += shift;
                first.mxfp4.insert(name, t);
            }
        }
        first
    }

    /// Whether the file has tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name) || self.mxfp4.contains_key(name)
    }

    pub fn tensor_count(&self) -> usize {
        self.content.tensor_infos.len() + self.mxfp4.len()
    }

    /// Each tensor's name and bytes in the file.
    pub fn tensor_sizes(&self) -> impl Iterator<Item = (&str, u64)> {
        let candle = self.content.tensor_infos.iter().map(|(n, t)| {
            let dtype = t.ggml_dtype;
            (
                n,
                t.shape.elem_count() / dtype.block_size() * dtype.type_size(),
            )
        });
        let mxfp4 = self
            .mxfp4
            .iter()
            .map(|(n, t)| (n, t.shape.elem_count() / 32 * mxfp4::BLOCK_BYTES));
        candle.chain(mxfp4).map(|(n, b)| (n.as_str(), b as u64))
    }

    /// Bytes of tensor data in the file.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensor_sizes().map(|(_, b)| b).sum()
    }
}

/// GGUF tensor `name` from `reader` (an MXFP4 one as Q8_0), an error naming
/// the tensor and its block type (or saying the file lacks it).
pub fn read_tensor<R: Read + Seek>(
    gguf: &Gguf,
    reader: &mut R,
    name: &str,
    device: &Device,
) -> anyhow::Result<QTensor> {
    if let Some(t) = gguf.mxfp4.get(name) {
        return read_mxfp4(gguf, t, reader, device)
            .map_err(|e| anyhow::anyhow!("tensor {name} (MXFP4): {e}"));
    }
    let kind = gguf
        .tensor_infos
        .get(name)
        .map(|i| format!("{:?}", i.ggml_dtype));
    gguf.content
        .tensor(reader, name, device)
        .map_err(|e| match kind {
            Some(kind) => anyhow::anyhow!("tensor {name} ({kind}): {e}"),
            None => anyhow::anyhow!("the file has no tensor {name}"),
        })
}

fn read_mxfp4<R: Read + Seek>(
    gguf: &Gguf,
    t: &Mxfp4Tensor,
    reader: &mut R,
    device: &Device,
) -> anyhow::Result<QTensor> {
    let elems = t.shape.elem_count();
    let rows = t.shape.dims().last().copied().unwrap_or(0);
    anyhow::ensure!(
        rows > 0 && rows.is_multiple_of(32),
        "rows of {rows} values are not whole blocks of 32"
    );
    let mut raw = vec![0u8; elems / 32 * mxfp4::BLOCK_BYTES];
    reader.seek(SeekFrom::Start(gguf.tensor_data_offset + t.offset))?;
    reader.read_exact(&mut raw)?;
    Ok(mxfp4::q8_0_tensor(t.shape.clone(), device, |out| {
        mxfp4::gguf_to_q8_0(&raw, out)
    })?)
}
