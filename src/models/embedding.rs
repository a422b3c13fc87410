//! Token embeddings: a dense f32 table, or a GGUF table kept in its
//! quantized tiles with rows dequantized on lookup. A 1B model's table is
//! 400 MB in f32 and a fifth of that quantized; a tied LM head multiplies
//! the same tiles instead of a copy.

use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::{Device, Result, Tensor};

use super::linear::{Linear, WeightFormat, WeightSpec};
use crate::quant::QuantMatrix;

pub enum Embedding {
    Dense(Tensor),
    /// Rows dequantized bit-exactly as GGML (and candle) dequantize them.
    Quant(Arc<QuantMatrix>),
}

impl Embedding {
    /// Quantized when weights are held as stored on the CPU and wick has
    /// kernels for the type; dense f32 otherwise. A head tied to the table
    /// multiplies on `spec`'s kernel.
    pub fn new(table: &QTensor, spec: WeightSpec, device: &Device) -> Result<Self> {
        if spec.format == WeightFormat::Native && device.is_cpu() {
            if let Some(m) = QuantMatrix::from_qtensor(table)? {
                return Ok(Embedding::Quant(Arc::new(m.with_kernel(spec.kernel)?)));
            }
        }
        Ok(Embedding::Dense(table.dequantize(device)?))
    }

    /// `[tokens, hidden]` f32.
    /// `tokens` are the ids, `on_device` the same on the table's device.
    pub fn forward(&self, tokens: &[u32], on_device: &Tensor) -> Result<Tensor> {
        match self {
            Embedding::Dense(t) => t.index_select(on_device, 0),
            Embedding::Quant(m) => {
                let k = m.k();
                let mut rows = vec![0f32; tokens.len() * k];
                for (&t, row) in tokens.iter().zip(rows.chunks_exact_mut(k)) {
                    if t as usize >= m.n() {
                        candle_core::bail!("token {t} is outside the {}-row embedding", m.n());
                    }
                    m.dequantize_row(t as usize, row);
                }
                Tensor::from_vec(rows, (tokens.len(), k), on_device.device())
            }
        }
    }

    /// A GGUF model's LM head: the file's own `output` matrix, else tied
    /// to this table (`table`, as stored), sharing its tiles where it
    /// holds them.
    pub fn lm_head(
        &self,
        output: Option<QTensor>,
        table: QTensor,
        spec: WeightSpec,
        device: &Device,
    ) -> Result<Linear> {
        match (output, self.shared()) {
            (Some(w), _) => Linear::new(w, spec, device),
            (None, Some(tiles)) => Ok(Linear::shared(tiles)),
            (None, None) => Linear::new(table, spec, device),
        }
    }

    /// The quantized table, for an LM head tied to it.
    pub fn shared(&self) -> Option<Arc<QuantMatrix>> {
        match self {
            Embedding::Quant(m) => Some(m.clone()),
            Embedding::Dense(_) => None,
        }
    }
}
