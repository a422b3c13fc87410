//! Runs a layer's plan of `paged_attention.cu` launches
//! ([`super::launch::plan`]) on a CUDA device: one launch writes the step's
//! K/V into the pool by slot mapping, one attends for every row of the flat
//! batch, and a third merges the parts where rows were split across blocks.
//! Everything they read comes from the step's one metadata upload
//! ([`StepMeta::kernel`]).

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Result, Storage, Tensor, WithDType};
use half::{bf16, f16};

use super::launch::{plan, supports, Buf, StepShape};
use super::AttnDims;
use crate::kv::step_meta::{KernelSections, StepMeta};
use crate::launch;

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/paged_attention.ptx"));
const MODULE: &str = "wick_paged_attention";

/// Writes this step's K/V rows of `qkv` into the pools, then attends:
/// `[T, num_heads * head_dim]` in `qkv`'s dtype. `sinks`: as
/// [`super::paged_attention`]'s.
pub fn write_and_attend(
    qkv: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    meta: &StepMeta,
    dims: AttnDims,
    sinks: Option<&Tensor>,
) -> Result<Tensor> {
    let candle_core::Device::Cuda(dev) = qkv.device() else {
        candle_core::bail!("the CUDA attention kernel needs its input on a CUDA device");
    };
    let n = meta.num_tokens() * dims.num_heads * dims.head_dim;
    // SAFETY: `alloc` leaves the memory unset; nothing reads `out` before
    // `write_and_attend_into` has written all `n` elements. The attend
    // launch has a block for every (row, KV head, subgroup), each writing
    // all `head_dim` values of its query heads, which cover heads
    // `0..num_heads` as `num_heads` is a multiple of `num_kv_heads`
    // (`ModelInfo::check_heads`, which `Engine::new` runs on every model
    // it serves; `AttnDims::group` relies on it too). With one part the attend launch writes the
    // output, else `paged_combine` writes every (row, head, value) of it.
    // The kernel's test poisons the output to catch a missed element. On
    // an error `out` is dropped unread.
    let out = match qkv.dtype() {
        DType::F32 => wrap(unsafe { dev.alloc::<f32>(n)? }, dev),
        DType::F16 => wrap(unsafe { dev.alloc::<f16>(n)? }, dev),
        DType::BF16 => wrap(unsafe { dev.alloc::<bf16>(n)? }, dev),
        other => candle_core::bail!("no CUDA attention kernel for {other:?} activations"),
    };
    let out = Tensor::from_storage(
        out,
        (meta.num_tokens(), dims.num_heads * dims.head_dim),
        BackpropOp::none(),
        false,
    );
    write_and_attend_into(qkv, k_pool, v_pool, meta, dims, sinks, &out)?;
    Ok(out)
}

fn wrap<T: CudaDType>(slice: CudaSlice<T>, dev: &CudaDevice) -> Storage {
    Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, dev.clone()))
}

/// [`write_and_attend`] into `out`, a contiguous `[T, num_heads *
/// head_dim]` tensor of `qkv`'s dtype. The pools are written in place, as
/// `scatter_set` would: the scheduler thread owns them and one stream orders
/// every launch.
pub fn write_and_attend_into(
    qkv: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    meta: &StepMeta,
    dims: AttnDims,
    sinks: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    let Some((packed, at)) = meta.kernel() else {
        candle_core::bail!("the step was not packed for the CUDA attention kernel");
    };
    if !supports(dims.head_dim) {
        candle_core::bail!("no CUDA attention kernel for head size {}", dims.head_dim);
    }
    let (q_s, q_l) = qkv.storage_and_layout();
    let (k_s, _) = k_pool.storage_and_layout();
    let (v_s, _) = v_pool.storage_and_layout();
    let (m_s, m_l) = packed.storage_and_layout();
    let (o_s, o_l) = out.storage_and_layout();
    // The kernels take a pointer either way: without sinks, one to a
    // value they never read (`has_sinks` is 0).
    let has_sinks = i32::from(sinks.is_some());
    let sinks = match sinks {
        Some(s) if s.dims() == [dims.num_heads] && s.dtype() == DType::F32 => s.contiguous()?,
        Some(s) => candle_core::bail!(
            "attention sinks are {:?} {:?}, not [{}] f32",
            s.dims(),
            s.dtype(),
            dims.num_heads
        ),
        None => Tensor::zeros(1, DType::F32, qkv.device())?,
    };
    let (s_s, s_l) = sinks.storage_and_layout();
    let (Storage::Cuda(s), Some((s_from, s_to))) = (&*s_s, s_l.contiguous_offsets()) else {
        candle_core::bail!("the attention sinks must be contiguous on the CUDA device");
    };
    let (Storage::Cuda(q), Storage::Cuda(k), Storage::Cuda(v), Storage::Cuda(m), Storage::Cuda(o)) =
        (&*q_s, &*k_s, &*v_s, &*m_s, &*o_s)
    else {
        candle_core::bail!("the CUDA attention kernel needs all its tensors on a CUDA device");
    };
    let (Some((q_from, q_to)), Some((m_from, m_to)), Some((o_from, o_to))) = (
        q_l.contiguous_offsets(),
        m_l.contiguous_offsets(),
        o_l.contiguous_offsets(),
    ) else {
        candle_core::bail!("the CUDA attention kernel needs contiguous inputs");
    };
    let step = Step {
        meta: m.as_cuda_slice::<u32>()?.slice(m_from..m_to),
        sinks: (s.as_cuda_slice::<f32>()?.slice(s_from..s_to), has_sinks),
        at,
        dims,
        rows: meta.num_tokens(),
        max_context: meta
            .seqs()
            .iter()
            .map(|s| s.context_len())
            .max()
            .unwrap_or(0),
        dev: q.device(),
    };
    if out.dtype() != qkv.dtype() || o_to - o_from != step.rows * dims.num_heads * dims.head_dim {
        candle_core::bail!(
            "the attention output must be [rows, heads * head_dim] in the input's dtype"
        );
    }
    /// Dispatches on the activations' dtype, then on the pool's.
    fn on_pool<Q: Elem>(
        step: &Step,
        qkv: CudaView<Q>,
        out: CudaView<Q>,
        k: &CudaStorage,
        v: &CudaStorage,
    ) -> Result<()> {
        match k.dtype() {
            DType::F32 => step.launch(&qkv, k.as_cuda_slice::<f32>()?, v.as_cuda_slice()?, &out),
            DType::F16 => step.launch(&qkv, k.as_cuda_slice::<f16>()?, v.as_cuda_slice()?, &out),
            DType::BF16 => step.launch(&qkv, k.as_cuda_slice::<bf16>()?, v.as_cuda_slice()?, &out),
            other => candle_core::bail!("no CUDA attention kernel for a {other:?} KV pool"),
        }
    }
    match qkv.dtype() {
        DType::F32 => on_pool(
            &step,
            q.as_cuda_slice::<f32>()?.slice(q_from..q_to),
            o.as_cuda_slice::<f32>()?.slice(o_from..o_to),
            k,
            v,
        ),
        DType::F16 => on_pool(
            &step,
            q.as_cuda_slice::<f16>()?.slice(q_from..q_to),
            o.as_cuda_slice::<f16>()?.slice(o_from..o_to),
            k,
            v,
        ),
        DType::BF16 => on_pool(
            &step,
            q.as_cuda_slice::<bf16>()?.slice(q_from..q_to),
            o.as_cuda_slice::<bf16>()?.slice(o_from..o_to),
            k,
            v,
        ),
        other => candle_core::bail!("no CUDA attention kernel for {other:?} activations"),
    }
}

/// A dtype the kernels are instantiated for.
trait Elem: DeviceRepr + WithDType + CudaDType {}
impl<T: DeviceRepr + WithDType + CudaDType> Elem for T {}

/// One layer's launch parameters.
struct Step<'a> {
    meta: CudaView<'a, u32>,
    /// The heads' sinks, and 1 if there are any (0: a placeholder).
    sinks: (CudaView<'a, f32>, i32),
    at: KernelSections,
    dims: AttnDims,
    rows: usize,
    max_context: usize,
    dev: &'a CudaDevice,
}

impl Step<'_> {
    fn launch<Q: Elem, P: Elem>(
        &self,
        qkv: &CudaView<Q>,
        k_pool: &CudaSlice<P>,
        v_pool: &CudaSlice<P>,
        out: &CudaView<Q>,
    ) -> Result<()> {
        let sms = self
            .dev
            .cuda_stream()
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .w()? as usize;
        let shape = StepShape {
            dims: self.dims,
            at: self.at,
            rows: self.rows,
            max_context: self.max_context,
            sms,
            has_sinks: self.sinks.1 != 0,
        };
        let plan = plan(shape, Q::DTYPE, P::DTYPE);
        // SAFETY: `alloc` leaves the memory unset. Where no row is split
        // they are one-element placeholders the kernels never touch. Where
        // rows are split, every block of the attend launch (all parts of
        // every row and head, a part past its row's range included: it
        // writes an empty state, max -inf) writes its `(max, sum)` and its
        // `head_dim` values before `paged_combine` reads them, the stream
        // ordering the two. Dropped at the end of this function, they are
        // freed on the same stream (cudarc frees asynchronously, or syncs
        // first).
        let part_ml = unsafe { self.dev.alloc::<f32>(plan.part_ml_len)? };
        let part_acc = unsafe { self.dev.alloc::<f32>(plan.part_acc_len)? };
        let stream = self.dev.cuda_stream();
        for l in &plan.launches {
            let func = self.dev.get_or_load_custom_func(&l.kernel, MODULE, PTX)?;
            // SAFETY: the plan's arguments match each kernel's parameters
            // in order and type (its buffers by role, above: `Q` and `P`
            // name the instantiation, `q_name` / `p_name` in the entry
            // point; the head size, which `write_and_attend_into` checked is
            // one of `supports`' sizes, picks the `attend` whose `EPL * 32`
            // it indexes by; the scalars are `i32` and `f32`). The kernels
            // write `k_pool`, `v_pool`, `out` and the part buffers through
            // shared references: the scheduler thread owns the pools, `out`
            // was just allocated (or is the caller's to give, as in the
            // kernel test), the part buffers are this function's, and the
            // one stream orders the launches among themselves and before
            // any later step. None uses dynamic shared memory. Their
            // accesses stay in bounds:
            //
            // `paged_write`, row `r < rows`:
            // - reads `qkv[r * stride + k_at|v_at ..][..kv_dim]`: `qkv` is
            //   `[rows, qkv_width]` (its width checked by `paged_attention`,
            //   its rows the step's tokens by construction: the model
            //   projects `meta.tokens_t()`), and `v_at + kv_dim ==
            //   qkv_width`.
            // - `meta[slots + r]` lies in the slots section
            //   `MetaBuffers::pack` packed with one entry per row (the
            //   window pool's section for a window layer, which falls back
            //   to the global one only when no sequence has a window table,
            //   i.e. the layer's pool is not split).
            // - each slot is `block * block_size + offset`
            //   (`step_meta::slot`), `offset < block_size`, from a table the
            //   scheduler grew to hold the sequence's whole `context_len`
            //   before scheduling it (`scheduler::grow`, the drafter
            //   likewise), its ids handed out by a `BlockManager` of exactly
            //   this pool's `num_blocks` (`Engine::new` builds both from one
            //   `KvLayout`; the window pool and the draft pool the same
            //   way). Freed window entries are never a new row's and are
            //   packed as block 0 regardless.
            // - so `slot < num_blocks * block_size`, the pool's rows, each
            //   `kv_dim` wide: `KvCache` sizes it by `KvLayout::kv_dim` from
            //   the same model info `AttnDims` comes from (`block_size` too,
            //   read from the cache's layout by the model).
            //
            // `paged_attend`, trusting what `MetaBuffers::pack`
            // (`pack_kernel`) packed for this very batch:
            // - `meta[row_seq + r]` is row `r`'s sequence `i < seqs.len()`,
            //   and `meta[seqs + SEQ_FIELDS * i ..]` its descriptor: the
            //   sequences cover the rows in order (`FlatBatch`), so `start <=
            //   r < start + len` and the row's position `first_pos + r -
            //   start` is below `context_len`.
            // - the descriptor's `table` field (`TABLE_FIELD`, or
            //   `WINDOW_TABLE_FIELD` for a window layer) is the absolute
            //   offset of a table packed after the descriptors, holding an
            //   entry for every block of positions `0..context_len` (the
            //   scheduler grew it so); the kernel reads entries `j /
            //   block_size` for `j` in the row's range `lo..end` only,
            //   within the row's part, where `end = meta[row_end + r]`
            //   (`SeqSlice::visible_end`) is at most `context_len`. A
            //   sequence without a window table has its block table in
            //   both fields; that happens only where the
            //   layer's pool is not split (whenever `Engine::new` splits it,
            //   the scheduler gives every sequence a window table).
            // - the entries are block ids below this pool's `num_blocks`, as
            //   for the write; a window table's freed entries lie before
            //   every row's window (`WindowBlocks::advance` frees only those)
            //   and are packed as block 0 anyway.
            // - the pools and `qkv` are as for the write; `num_heads` is a
            //   multiple of `num_kv_heads` (see `write_and_attend`), so the
            //   grid's KV heads and subgroups address heads below
            //   `num_heads`.
            // - with `has_sinks`, `sinks` holds `num_heads` f32 (checked in
            //   `write_and_attend_into`) and the kernel reads `sinks[head]`
            //   for the heads above; without, it reads nothing of it.
            // - `out` holds `rows * num_heads * head_dim` values (checked in
            //   `write_and_attend_into`); with split rows the part buffers
            //   hold `rows * num_heads * parts` states (`Plan::part_ml_len`,
            //   `part_acc_len`).
            // - the offsets fit `i32`: the packed buffer holds a step's rows
            //   and tables, far below 2^31 entries.
            //
            // `paged_combine`: the grid's `y` is `num_heads`, which the
            // kernel reads as the row stride (`gridDim.y`), and its block
            // is `head_dim` threads, the head size it is passed: row `r`,
            // head `h`, value `d` reads `part_ml[((r * num_heads + h) *
            // parts + p) * 2 ..]` and `part_acc[((r * num_heads + h) * parts
            // + p) * head_dim + d]` for `p < parts`, inside the states the
            // attend launch just wrote, and `sinks[h]` with `has_sinks`; it
            // writes `out[(r * num_heads + h) * head_dim + d]`, inside
            // `out`.
            unsafe {
                launch::cuda::launch(&stream, &func, l, |b, role| {
                    match role {
                        Buf::Qkv => b.arg(qkv),
                        Buf::KPool => b.arg(k_pool),
                        Buf::VPool => b.arg(v_pool),
                        Buf::Meta => b.arg(&self.meta),
                        Buf::Sinks => b.arg(&self.sinks.0),
                        Buf::Out => b.arg(out),
                        Buf::PartMl => b.arg(&part_ml),
                        Buf::PartAcc => b.arg(&part_acc),
                    };
                })?;
            }
        }
        Ok(())
    }
}
