//! Sampling on a CUDA device (`sampler.cu`, the twin of `sampler.rs`):
//! each row's sampling packed as the kernel reads it, and the launch. A
//! row is packed from its sequence's [`Sampler`](super::sampler::Sampler)
//! (`device_row`), which draws the key its own `sample` would, so a seeded
//! request takes the same tokens on a GPU as on the CPU.

use crate::launch::{Arg, Launch};

/// Fields a row, in the kernel's `F_*` order.
const FIELDS: usize = 17;
/// No list, no logprobs: `NONE` in the kernel.
const NONE: u32 = u32::MAX;
/// `THREADS` in the kernel.
const THREADS: u32 = 1024;

/// One row's sampling, as the kernel takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceRow {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// The race's key (unused when greedy).
    pub key: u64,
    /// How many top logprobs, where logprobs are asked for.
    pub logprobs: Option<usize>,
    /// `logit_bias`, distinct ids.
    pub bias: Vec<(u32, f32)>,
    /// Each distinct id of the prompt and output: whether the repetition
    /// penalty takes it (any occurrence) and how often the output has it.
    pub penalties: Vec<(u32, bool, u32)>,
    /// Ids masked for `min_tokens`.
    pub banned: Vec<u32>,
    /// The grammar's allowed ids, bit `i % 32` of word `i / 32`, words for
    /// the whole row of logits.
    pub allowed: Option<Vec<u32>>,
}

/// The kernel's params buffer: every row's fields, then their lists at the
/// offsets the fields give.
pub fn pack(rows: &[DeviceRow]) -> Vec<u32> {
    let mut buf = vec![0u32; rows.len() * FIELDS];
    for (r, row) in rows.iter().enumerate() {
        let list = |buf: &mut Vec<u32>, words: &[u32]| {
            let at = buf.len() as u32;
            buf.extend_from_slice(words);
            at
        };
        let bias: Vec<u32> = row
            .bias
            .iter()
            .flat_map(|&(id, b)| [id, b.to_bits()])
            .collect();
        let penalties: Vec<u32> = row
            .penalties
            .iter()
            .flat_map(|&(id, rep, count)| [id, u32::from(rep), count])
            .collect();
        let bias_at = list(&mut buf, &bias);
        let penalty_at = list(&mut buf, &penalties);
        let banned_at = list(&mut buf, &row.banned);
        let mask_at = match &row.allowed {
            Some(words) => list(&mut buf, words),
            None => NONE,
        };
        let fields = [
            row.temperature.to_bits(),
            row.top_k.min(u32::MAX as usize) as u32,
            row.top_p.to_bits(),
            row.min_p.to_bits(),
            row.repetition_penalty.to_bits(),
            row.presence_penalty.to_bits(),
            row.frequency_penalty.to_bits(),
            row.key as u32,
            (row.key >> 32) as u32,
            row.logprobs.map_or(NONE, |n| n as u32),
            bias_at,
            row.bias.len() as u32,
            penalty_at,
            row.penalties.len() as u32,
            banned_at,
            row.banned.len() as u32,
            mask_at,
        ];
        buf[r * FIELDS..(r + 1) * FIELDS].copy_from_slice(&fields);
    }
    buf
}

/// The kernel's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buf {
    /// f32 `[rows, vocab]`, read only.
    Logits,
    /// f32 `[rows, vocab]` scratch: the processed logits, then weights.
    Work,
    /// [`pack`]'s words.
    Params,
    /// `rows` u32: the picks.
    Ids,
    /// `rows` f32: each pick's logprob (NaN where none was asked for).
    Logprobs,
    /// `[rows, max_top]` (id, f32 logprob bits) pairs, most likely first,
    /// `u32::MAX` past the ones asked for.
    Top,
}

/// The launch that samples `rows` rows of `vocab` logits, with room for
/// `max_top` top logprobs a row: one block of exactly THREADS threads per
/// row (the kernel's reductions read one partial per warp, 32 of them, and
/// its static shared memory is a few KiB); no dynamic shared memory.
pub fn launch(rows: usize, vocab: usize, max_top: usize) -> Launch<Buf> {
    Launch {
        kernel: "sample_rows".into(),
        grid: (rows as u32, 1, 1),
        block: (THREADS, 1, 1),
        args: vec![
            Arg::Buf(Buf::Logits),
            Arg::Buf(Buf::Work),
            Arg::U32(vocab as u32),
            Arg::Buf(Buf::Params),
            Arg::U32(max_top as u32),
            Arg::Buf(Buf::Ids),
            Arg::Buf(Buf::Logprobs),
            Arg::Buf(Buf::Top),
        ],
    }
}

#[cfg(feature = "cuda")]
pub mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    use candle_core::{Result, Storage, Tensor};

    use super::{launch, pack, Buf, DeviceRow};
    use crate::sampling::token::SampledToken;

    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/sampler.ptx"));
    const MODULE: &str = "wick_sampler";

    /// Samples each row of `logits` (`[rows.len(), vocab]` on a CUDA
    /// device, any float dtype) under its [`DeviceRow`]; only the ids and
    /// the logprobs asked for come back.
    pub fn sample_rows(logits: &Tensor, rows: &[DeviceRow]) -> Result<Vec<SampledToken>> {
        let logits = logits.to_dtype(candle_core::DType::F32)?.contiguous()?;
        let (n, vocab) = logits.dims2()?;
        if n != rows.len() {
            candle_core::bail!("{} sampling rows for {n} rows of logits", rows.len());
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        for row in rows {
            if row
                .allowed
                .as_ref()
                .is_some_and(|w| w.len() != vocab.div_ceil(32))
            {
                candle_core::bail!("a grammar mask not of {vocab} ids");
            }
        }
        let (storage, layout) = logits.storage_and_layout();
        let Storage::Cuda(s) = &*storage else {
            candle_core::bail!("the CUDA sampler needs its logits on a CUDA device");
        };
        let Some((from, to)) = layout.contiguous_offsets() else {
            candle_core::bail!("the CUDA sampler needs contiguous logits");
        };
        let dev = s.device().clone();
        let input = s.as_cuda_slice::<f32>()?.slice(from..to);
        let max_top = rows.iter().filter_map(|r| r.logprobs).max().unwrap_or(0);
        let params = dev.clone_htod(&pack(rows)[..])?;
        // SAFETY: `alloc` leaves the memory unset. The kernel writes all of
        // `work` for its row before reading it, and thread 0 of each row's
        // block writes `ids[r]`, `logprobs[r]` and all `max_top` pairs of
        // `top` for the row (past the ones asked for, `u32::MAX`), before
        // the copies below read them, the stream ordering the two.
        let work = unsafe { dev.alloc::<f32>(n * vocab)? };
        let ids = unsafe { dev.alloc::<u32>(n)? };
        let logprobs = unsafe { dev.alloc::<f32>(n)? };
        let top = unsafe { dev.alloc::<u32>((n * max_top * 2).max(1))? };
        let plan = launch(n, vocab, max_top);
        let func = dev.get_or_load_custom_func(&plan.kernel, MODULE, PTX)?;
        let stream = dev.cuda_stream();
        // SAFETY: the arguments match `sample_rows(const float*, float*,
        // uint32_t, const uint32_t*, uint32_t, uint32_t*, float*,
        // uint32_t*)` in order and type. Block `r < n` reads `input[r *
        // vocab..][..vocab]` (the contiguous f32 `[n, vocab]` logits,
        // checked above) and writes `work[r * vocab..][..vocab]`, both
        // within their `n * vocab` values. It reads its `FIELDS` words of
        // `params` at `r * FIELDS`, and the lists at the offsets `pack`
        // wrote there, each of the length it wrote beside it; a grammar
        // mask holds `vocab.div_ceil(32)` words (checked above), of which
        // the kernel reads word `i / 32` for ids `i < vocab`; list ids
        // past the vocabulary are skipped. It writes `ids[r]`,
        // `logprobs[r]` and `top[(r * max_top + k) * 2..][..2]` for `k <
        // max_top`, within the allocations above, which nothing else
        // holds. Its shared memory is static.
        unsafe {
            crate::launch::cuda::launch(&stream, &func, &plan, |b, role| {
                match role {
                    Buf::Logits => b.arg(&input),
                    Buf::Work => b.arg(&work),
                    Buf::Params => b.arg(&params),
                    Buf::Ids => b.arg(&ids),
                    Buf::Logprobs => b.arg(&logprobs),
                    Buf::Top => b.arg(&top),
                };
            })?;
        }
        let ids = dev.clone_dtoh(&ids)?;
        let logprobs = dev.clone_dtoh(&logprobs)?;
        let top = dev.clone_dtoh(&top)?;
        Ok(rows
            .iter()
            .enumerate()
            .map(|(r, row)| SampledToken {
                id: ids[r],
                logprob: row.logprobs.map(|_| logprobs[r]),
                top_logprobs: (0..row.logprobs.unwrap_or(0))
                    .map(|k| &top[(r * max_top + k) * 2..][..2])
                    .filter(|p| p[0] != u32::MAX)
                    .map(|p| (p[0], f32::from_bits(p[1])))
                    .collect(),
            })
            .collect())
    }
}
