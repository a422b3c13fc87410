//! A linear layer (`y = x Wᵀ`) over whichever weight representation was
//! chosen at load: wick's own quantized CPU kernels, candle's quantized
//! matmul, or dense f32/bf16 weights through candle's gemm.

use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Module, Result, Shape, Tensor};

use crate::quant::QuantMatrix;

/// How weights are held and multiplied (`--weights`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum WeightFormat {
    /// As stored in the file (Q4_1 for the default model), multiplied by
    /// wick's SIMD kernels on the CPU and by candle's elsewhere.
    #[default]
    Native,
    /// As stored, through candle's own quantized matmul (the baseline).
    Candle,
    /// Re-quantized to Q8_0 at load, wick's kernels.
    #[value(name = "q8_0")]
    #[serde(rename = "q8_0")]
    Q8_0,
    /// Dequantized to f32, candle's gemm.
    F32,
    /// Dequantized to bf16, candle's matmul.
    Bf16,
}

pub enum Linear {
    Wick(QuantMatrix),
    Candle(QMatMul),
    Dense(Tensor),
}

impl Linear {
    pub fn new(w: QTensor, format: WeightFormat, device: &Device) -> Result<Self> {
        let dense = |dtype: DType| -> Result<Linear> {
            Ok(Linear::Dense(w.dequantize(device)?.to_dtype(dtype)?))
        };
        let wick = |w: &QTensor| -> Result<Option<Linear>> {
            if !device.is_cpu() {
                return Ok(None);
            }
            Ok(QuantMatrix::from_qtensor(w)?.map(Linear::Wick))
        };
        match format {
            WeightFormat::F32 => dense(DType::F32),
            WeightFormat::Bf16 => dense(DType::BF16),
            WeightFormat::Native => match wick(&w)? {
                Some(l) => Ok(l),
                None => Ok(Linear::Candle(QMatMul::from_qtensor(w)?)),
            },
            WeightFormat::Candle => Ok(Linear::Candle(QMatMul::from_qtensor(w)?)),
            WeightFormat::Q8_0 => {
                let w = if w.dtype() == GgmlDType::Q8_0 {
                    w
                } else {
                    QTensor::quantize(&w.dequantize(device)?, GgmlDType::Q8_0)?
                };
                match wick(&w)? {
                    Some(l) => Ok(l),
                    None => Ok(Linear::Candle(QMatMul::from_qtensor(w)?)),
                }
            }
        }
    }

    /// `x`: `[rows, in]` f32. Returns `[rows, out]` f32.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Wick(m) => x.contiguous()?.apply_op1_no_bwd(&WickMatmul(m)),
            Linear::Candle(m) => m.forward(x),
            Linear::Dense(w) => {
                let xs = x.to_dtype(w.dtype())?;
                xs.matmul(&w.t()?)?.to_dtype(DType::F32)
            }
        }
    }
}

/// Stacks quantized matrices with the same input size and block type into
/// one, so q/k/v (or gate/up) cost one matmul call instead of several.
/// Rows are whole blocks, so concatenating the raw bytes stacks the rows.
pub fn stack_rows(ws: &[QTensor], device: &Device) -> Result<QTensor> {
    let dtype = ws[0].dtype();
    let k = ws[0].shape().dims2()?.1;
    let mut bytes = Vec::new();
    let mut n = 0;
    for w in ws {
        let (rows, cols) = w.shape().dims2()?;
        if w.dtype() != dtype || cols != k {
            candle_core::bail!(
                "cannot stack {:?} {:?} onto {:?} [_, {k}]",
                w.dtype(),
                w.shape(),
                dtype
            );
        }
        bytes.extend_from_slice(&w.data()?);
        n += rows;
    }
    QTensor::new(
        QStorage::from_data(Cow::Owned(bytes), device, dtype)?,
        (n, k),
    )
}

struct WickMatmul<'a>(&'a QuantMatrix);

impl CustomOp1 for WickMatmul<'_> {
    fn name(&self) -> &'static str {
        "wick-quant-matmul"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("matmul input must be contiguous".into()))?;
        let x = &storage.as_slice::<f32>()?[start..end];
        let (n, k) = (self.0.n(), self.0.k());
        if x.len() % k != 0 {
            candle_core::bail!("matmul input of {} values is not rows of {k}", x.len());
        }
        let m = x.len() / k;
        let mut out = vec![0f32; m * n];
        self.0.matmul(x, m, &mut out);
        Ok((CpuStorage::F32(out), Shape::from((m, n))))
    }
}
