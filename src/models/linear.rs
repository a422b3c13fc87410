//! A linear layer (`y = x Wᵀ`) over whichever weight representation was
//! chosen at load: wick's own quantized CPU kernels, candle's quantized
//! matmul, or dense f32/bf16 weights through candle's gemm.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Module, Result, Shape, Tensor};

use crate::quant::bf16::Bf16Matrix;
use crate::quant::{Kernel, QuantMatrix};

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

/// How a loader builds each layer's weights: their format, and which CPU
/// kernels multiply those held on wick's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WeightSpec {
    pub format: WeightFormat,
    pub kernel: Kernel,
}

impl From<WeightFormat> for WeightSpec {
    fn from(format: WeightFormat) -> Self {
        WeightSpec {
            format,
            kernel: Kernel::Auto,
        }
    }
}

pub struct Linear {
    weights: Weights,
    /// `[out]` f32, added after the product.
    bias: Option<Tensor>,
}

enum Weights {
    /// Shared with a tied embedding table when the head is tied.
    Wick(Arc<QuantMatrix>),
    Candle(QMatMul),
    /// `[out, in]`, in the dtype the product runs in.
    Dense(Tensor),
    /// bf16 on AMX tiles, f32 sums.
    Tiles(Bf16Matrix),
    /// Matrices of different block types side by side: each multiplies on
    /// its own and the outputs are concatenated.
    Parts(Vec<Weights>),
}

impl Linear {
    /// From quantized (GGUF) matrices with the same input size, their
    /// outputs side by side (q/k/v, gate/up). Neighbours of one block type
    /// are stacked into one matrix, one matmul call; files that mix types per
    /// tensor (`*_K_M`: q and k Q5_0, v Q8_0) multiply each run on its own.
    pub fn stacked(ws: Vec<QTensor>, spec: WeightSpec, device: &Device) -> Result<Self> {
        let mut parts = ws
            .chunk_by(|a, b| a.dtype() == b.dtype())
            .map(|run| Self::weights(stack_rows(run, device)?, spec, device))
            .collect::<Result<Vec<_>>>()?;
        let weights = if parts.len() == 1 {
            parts.remove(0)
        } else {
            Weights::Parts(parts)
        };
        Ok(Linear {
            weights,
            bias: None,
        })
    }

    /// From a quantized (GGUF) matrix, held as `spec` says.
    pub fn new(w: QTensor, spec: WeightSpec, device: &Device) -> Result<Self> {
        Ok(Linear {
            weights: Self::weights(w, spec, device)?,
            bias: None,
        })
    }

    /// Multiplies by matrix tiles already held (a tied embedding table's).
    pub fn shared(m: Arc<QuantMatrix>) -> Self {
        Linear {
            weights: Weights::Wick(m),
            bias: None,
        }
    }

    /// Adds `bias` (`[out]`) to every output row.
    pub fn with_bias(self, bias: Tensor) -> Result<Self> {
        Ok(Linear {
            bias: Some(bias.to_dtype(DType::F32)?),
            ..self
        })
    }

    fn weights(w: QTensor, spec: WeightSpec, device: &Device) -> Result<Weights> {
        let dense = |dtype: DType| -> Result<Weights> {
            Ok(Weights::Dense(w.dequantize(device)?.to_dtype(dtype)?))
        };
        let wick = |w: &QTensor| -> Result<Option<Weights>> {
            if !device.is_cpu() {
                return Ok(None);
            }
            QuantMatrix::from_qtensor(w)?
                .map(|m| Ok(Weights::Wick(Arc::new(m.with_kernel(spec.kernel)?))))
                .transpose()
        };
        let weights = match spec.format {
            WeightFormat::F32 => dense(DType::F32)?,
            WeightFormat::Bf16 => dense(DType::BF16)?,
            WeightFormat::Native => match wick(&w)? {
                Some(l) => l,
                None => Weights::Candle(QMatMul::from_qtensor(w)?),
            },
            WeightFormat::Candle => Weights::Candle(QMatMul::from_qtensor(w)?),
            WeightFormat::Q8_0 => {
                let w = if w.dtype() == GgmlDType::Q8_0 {
                    w
                } else {
                    QTensor::quantize(&w.dequantize(device)?, GgmlDType::Q8_0)?
                };
                match wick(&w)? {
                    Some(l) => l,
                    None => Weights::Candle(QMatMul::from_qtensor(w)?),
                }
            }
        };
        Ok(weights)
    }

    /// From a dense `[out, in]` matrix (safetensors checkpoints): kept in its
    /// dtype, or converted to f32 or bf16 as `--weights` says (for a
    /// checkpoint that also holds quantized weights, gpt-oss's MXFP4
    /// experts, which those formats dequantize), or re-quantized to Q8_0
    /// for wick's kernels with `WeightFormat::Q8_0` on the CPU.
    pub fn dense(w: Tensor, bias: Option<Tensor>, spec: WeightSpec) -> Result<Self> {
        // Q8_0 blocks are 32 inputs long: a narrower matrix (Gemma 4's
        // per-layer projections) stays as it is, as llama-quantize leaves
        // such a tensor unquantized.
        let blocks_fit = w.dims2()?.1 % 32 == 0;
        let weights = match spec.format {
            WeightFormat::Native => Weights::Dense(w),
            WeightFormat::Q8_0 if !blocks_fit => Weights::Dense(w),
            WeightFormat::Q8_0 if w.device().is_cpu() => {
                let (n, k) = w.dims2()?;
                let values = w.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                let m = QuantMatrix::quantize_q8_0(&values, n, k)?.with_kernel(spec.kernel)?;
                Weights::Wick(Arc::new(m))
            }
            WeightFormat::Q8_0 => {
                let q = QTensor::quantize(&w.to_dtype(DType::F32)?, GgmlDType::Q8_0)?;
                Weights::Candle(QMatMul::from_qtensor(q)?)
            }
            WeightFormat::F32 => Weights::Dense(w.to_dtype(DType::F32)?),
            WeightFormat::Bf16 => Weights::Dense(w.to_dtype(DType::BF16)?),
            WeightFormat::Candle => candle_core::bail!(
                "--weights candle applies to GGUF files; safetensors weights take \
                 --weights native (with --dtype), f32, bf16 or q8_0"
            ),
        };
        let bias = bias.map(|b| b.to_dtype(DType::F32)).transpose()?;
        Ok(Linear { weights, bias })
    }

    /// From `w` (`[out, in]`) and `bias` (`[out]`), multiplied in bf16 on
    /// AMX tiles with f32 sums, or in f32 where the CPU has no tiles.
    pub fn bf16_tiles(w: &Tensor, bias: Tensor) -> Result<Self> {
        let (n, k) = w.dims2()?;
        let values = w.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let weights = match Bf16Matrix::new(&values, n, k) {
            Some(m) => Weights::Tiles(m),
            None => Weights::Dense(w.to_dtype(DType::F32)?),
        };
        Ok(Linear {
            weights,
            bias: Some(bias.to_dtype(DType::F32)?),
        })
    }

    /// The matrices on wick's kernels that this layer alone holds (a tied
    /// head's table is the embedding's too), for [`crate::quant::share_pages`].
    pub fn own_matrices(&mut self) -> Vec<&mut QuantMatrix> {
        self.weights.own_matrices()
    }

    /// `x`: `[rows, in]` f32. Returns `[rows, out]` f32.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.weights.forward(x)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

impl Weights {
    fn own_matrices(&mut self) -> Vec<&mut QuantMatrix> {
        match self {
            Weights::Wick(m) => Arc::get_mut(m).into_iter().collect(),
            Weights::Parts(parts) => parts.iter_mut().flat_map(Weights::own_matrices).collect(),
            Weights::Candle(_) | Weights::Dense(_) | Weights::Tiles(_) => Vec::new(),
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Weights::Wick(m) => x.contiguous()?.apply_op1_no_bwd(&HostMatmul(&**m)),
            Weights::Tiles(m) => x
                .to_dtype(DType::F32)?
                .contiguous()?
                .apply_op1_no_bwd(&HostMatmul(m)),
            Weights::Candle(m) => m.forward(x),
            Weights::Dense(w) => {
                let xs = x.to_dtype(w.dtype())?;
                xs.matmul(&w.t()?)?.to_dtype(DType::F32)
            }
            Weights::Parts(parts) => {
                let outs = parts
                    .iter()
                    .map(|p| p.forward(x))
                    .collect::<Result<Vec<_>>>()?;
                Tensor::cat(&outs, 1)
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

/// A matrix on wick's own CPU kernels.
trait HostMatrix {
    /// Outputs and inputs per row.
    fn shape(&self) -> (usize, usize);
    /// `x Wᵀ` for `m` rows of `x`.
    fn product(&self, x: &[f32], m: usize) -> Vec<f32>;
}

impl HostMatrix for QuantMatrix {
    fn shape(&self) -> (usize, usize) {
        (self.n(), self.k())
    }

    fn product(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_to_vec(x, m)
    }
}

impl HostMatrix for Bf16Matrix {
    fn shape(&self) -> (usize, usize) {
        (self.n(), self.k())
    }

    fn product(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul(x, m)
    }
}

/// `x Wᵀ` on the host, reading `x` where it lies.
struct HostMatmul<'a, M>(&'a M);

impl<M: HostMatrix> CustomOp1 for HostMatmul<'_, M> {
    fn name(&self) -> &'static str {
        "wick-host-matmul"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("matmul input must be contiguous".into()))?;
        let x = &storage.as_slice::<f32>()?[start..end];
        let (n, k) = self.0.shape();
        if x.len() % k != 0 {
            candle_core::bail!("matmul input of {} values is not rows of {k}", x.len());
        }
        let m = x.len() / k;
        let out = self.0.product(x, m);
        Ok((CpuStorage::F32(out), Shape::from((m, n))))
    }
}
