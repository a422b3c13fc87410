//! Each row's argmax, picked where the logits are. On a CUDA device
//! `argmax.cu` reduces every row in one launch and only the ids cross to
//! the host; elsewhere the rows come back and the host's [`argmax`]
//! picks. Both follow one
//! rule: the lowest id among the largest values, NaN never picked.

use candle_core::{DType, Result, Tensor};

use crate::launch::{Arg, Launch};
use crate::vec_math::{max_of, position_of};

/// The lowest id among the largest logits; NaN is never picked (a row of
/// NaN gives 0). [`argmax_rows`]' kernel is its
/// twin on a CUDA device.
pub fn argmax(logits: &[f32]) -> u32 {
    position_of(logits, max_of(logits)).unwrap_or(0) as u32
}

/// The argmax of each row of `logits`, `[rows, vocab]`.
pub fn argmax_rows(logits: &Tensor) -> Result<Vec<u32>> {
    let logits = logits.to_dtype(DType::F32)?;
    #[cfg(feature = "cuda")]
    if logits.device().is_cuda() {
        return cuda::argmax_rows(&logits.contiguous()?);
    }
    Ok(logits.to_vec2::<f32>()?.iter().map(|r| argmax(r)).collect())
}

/// `argmax.cu`'s buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buf {
    /// Contiguous f32 `[rows, vocab]`.
    Logits,
    /// `rows` u32.
    Out,
}

/// `THREADS` in the kernel.
const THREADS: u32 = 512;

/// The launch that picks each of `rows` rows' argmax: one block of exactly
/// THREADS threads per row (the kernel strides by THREADS and sizes its
/// static shared arrays, THREADS / 32 pairs, by it, not by blockDim); no
/// dynamic shared memory. `vocab` must fit a u32.
pub fn launch(rows: usize, vocab: usize) -> Launch<Buf> {
    Launch {
        kernel: "argmax_rows_f32".into(),
        grid: (rows as u32, 1, 1),
        block: (THREADS, 1, 1),
        args: vec![
            Arg::Buf(Buf::Logits),
            Arg::U32(vocab as u32),
            Arg::Buf(Buf::Out),
        ],
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    use candle_core::op::BackpropOp;
    use candle_core::{CudaStorage, Result, Storage, Tensor};

    use super::Buf;
    use crate::launch;

    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/argmax.ptx"));
    const MODULE: &str = "wick_argmax";

    /// `logits`: contiguous f32 `[rows, vocab]` on a CUDA device.
    pub fn argmax_rows(logits: &Tensor) -> Result<Vec<u32>> {
        let (rows, vocab) = logits.dims2()?;
        if rows == 0 {
            return Ok(Vec::new());
        }
        let (storage, layout) = logits.storage_and_layout();
        let Storage::Cuda(s) = &*storage else {
            candle_core::bail!("the CUDA argmax needs its logits on a CUDA device");
        };
        let Some((from, to)) = layout.contiguous_offsets() else {
            candle_core::bail!("the CUDA argmax needs contiguous logits");
        };
        let dev = s.device().clone();
        let input = s.as_cuda_slice::<f32>()?.slice(from..to);
        // SAFETY: `alloc` leaves the memory unset; the launch below has one
        // block per row, and each block's lane 0 of warp 0 writes its row's
        // id, so all `rows` elements are written before `to_vec1` reads them
        // (the same stream orders the copy after the launch).
        let out = unsafe { dev.alloc::<u32>(rows)? };
        let launch = super::launch(rows, vocab);
        let func = dev.get_or_load_custom_func(&launch.kernel, MODULE, PTX)?;
        let stream = dev.cuda_stream();
        // SAFETY: the arguments match `argmax_rows_f32(const float*, uint32_t,
        // uint32_t*)` in order and type. Block `r < rows` reads
        // `input[r * vocab..][..vocab]`: `input` is the contiguous
        // `[rows, vocab]` f32 slice of `logits` (its dims, dtype and
        // contiguity checked above), and `vocab` fits the kernel's u32 (a
        // vocabulary is far below 2^32). It writes only `out[r]`, through a
        // shared reference to the slice allocated above, which nothing else
        // holds.
        unsafe {
            launch::cuda::launch(&stream, &func, &launch, |b, role| {
                match role {
                    Buf::Logits => b.arg(&input),
                    Buf::Out => b.arg(&out),
                };
            })?;
        }
        let out = Storage::Cuda(CudaStorage::wrap_cuda_slice(out, dev));
        Tensor::from_storage(out, rows, BackpropOp::none(), false).to_vec1::<u32>()
    }
}
