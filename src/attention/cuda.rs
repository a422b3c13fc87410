//! Launches `paged_attention.cu` (its launch shapes are explained there):
//! for a layer, one launch writes the step's K/V into the pool by slot
//! mapping, one attends for every row of the flat batch, and a third merges
//! the parts where rows were split across blocks. Everything they read comes
//! from the step's one metadata upload ([`StepMeta::kernel`]).

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Result, Storage, Tensor, WithDType};
use half::{bf16, f16};

use super::AttnDims;
use crate::kv::step_meta::{KernelSections, StepMeta, TABLE_FIELD, WINDOW_TABLE_FIELD};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/paged_attention.ptx"));
const MODULE: &str = "wick_paged_attention";
/// Warps per attention block (`WARPS` in the kernel).
const WARPS: u32 = 4;
/// Query heads per block (`MAX_GROUP` in the kernel).
const MAX_GROUP: usize = 8;

/// Head sizes the kernel is instantiated for (32 lanes times 1, 2, 3, 4 or
/// 8 values).
pub fn supports(head_dim: usize) -> bool {
    matches!(head_dim, 32 | 64 | 96 | 128 | 256)
}

/// Writes this step's K/V rows of `qkv` into the pools, then attends:
/// `[T, num_heads * head_dim]` in `qkv`'s dtype.
pub fn write_and_attend(
    qkv: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    meta: &StepMeta,
    dims: AttnDims,
) -> Result<Tensor> {
    let candle_core::Device::Cuda(dev) = qkv.device() else {
        candle_core::bail!("the CUDA attention kernel needs its input on a CUDA device");
    };
    let n = meta.num_tokens() * dims.num_heads * dims.head_dim;
    // Every element is written by the kernel (its test poisons the output).
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
    write_and_attend_into(qkv, k_pool, v_pool, meta, dims, &out)?;
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
        let d = self.dims;
        let (q_name, p_name) = (Q::DTYPE.as_str(), P::DTYPE.as_str());
        let func = |name: String| self.dev.get_or_load_custom_func(&name, MODULE, PTX);
        let i = |x: usize| x as i32;
        let (k_at, v_at) = d.kv_offsets();
        let (stride, kv_dim) = (i(d.qkv_width()), i(d.num_kv_heads * d.head_dim));
        let windowed = d.window.is_some();
        let slots = i(match windowed {
            true => self.at.window_slots,
            false => self.at.slots,
        });

        let write = func(format!("paged_write_{q_name}_{p_name}"))?;
        let mut b = write.builder();
        let (k_at, v_at) = (i(k_at), i(v_at));
        b.arg(qkv).arg(&stride).arg(&k_at).arg(&v_at).arg(&kv_dim);
        b.arg(&self.meta).arg(&slots).arg(k_pool).arg(v_pool);
        let cfg = LaunchConfig {
            grid_dim: (self.rows as u32, 1, 1),
            block_dim: ((d.num_kv_heads * d.head_dim).min(256) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { b.launch(cfg) }.w()?;

        let subgroups = d.group().div_ceil(MAX_GROUP);
        let blocks = self.rows * d.num_kv_heads * subgroups;
        let parts = self.parts(blocks)?;
        let part_len = i(self.max_context.div_ceil(parts));
        let (head_rows, hd) = (self.rows * d.num_heads, d.head_dim);
        // Split rows keep each part's (max, sum) and unnormalised values,
        // every one written by the attention launch (one unused element
        // each where nothing is split).
        let split_len = |per: usize| {
            if parts > 1 {
                head_rows * parts * per
            } else {
                1
            }
        };
        let part_ml = unsafe { self.dev.alloc::<f32>(split_len(2))? };
        let part_acc = unsafe { self.dev.alloc::<f32>(split_len(hd))? };
        let attend = func(format!("paged_attend_{q_name}_{p_name}_{hd}"))?;
        let mut b = attend.builder();
        let table = i(match windowed {
            true => WINDOW_TABLE_FIELD,
            false => TABLE_FIELD,
        });
        let (seqs, row_seq) = (i(self.at.seqs), i(self.at.row_seq));
        let (nh, nkv, bs) = (i(d.num_heads), i(d.num_kv_heads), i(d.block_size));
        let window = i(d.window.unwrap_or(0));
        let scale = 1.0 / (hd as f32).sqrt();
        b.arg(qkv).arg(&stride).arg(k_pool).arg(v_pool);
        b.arg(&self.meta).arg(&seqs).arg(&row_seq).arg(&table);
        b.arg(&nh)
            .arg(&nkv)
            .arg(&bs)
            .arg(&window)
            .arg(&scale)
            .arg(&part_len);
        b.arg(out).arg(&part_ml).arg(&part_acc);
        let cfg = LaunchConfig {
            grid_dim: (
                self.rows as u32,
                (d.num_kv_heads * subgroups) as u32,
                parts as u32,
            ),
            block_dim: (WARPS * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { b.launch(cfg) }.w()?;
        if parts == 1 {
            return Ok(());
        }

        let combine = func(format!("paged_combine_{q_name}"))?;
        let mut b = combine.builder();
        let (parts_arg, hd_arg) = (i(parts), i(hd));
        b.arg(&part_ml)
            .arg(&part_acc)
            .arg(&parts_arg)
            .arg(&hd_arg)
            .arg(out);
        let cfg = LaunchConfig {
            grid_dim: (self.rows as u32, d.num_heads as u32, 1),
            block_dim: (hd as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { b.launch(cfg) }.w().map(|_| ())
    }

    /// How many parts each row's keys are split into ([`super::split::parts`]).
    fn parts(&self, blocks: usize) -> Result<usize> {
        let sms = self
            .dev
            .cuda_stream()
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .w()? as usize;
        Ok(super::split::parts(blocks, sms, self.max_context))
    }
}
