//! One layer's launches of `paged_attention.cu` (its launch shapes are
//! explained there), as data: `cuda.rs` runs them on a GPU, and the kernel
//! tests run the same plan on the host build.

use candle_core::DType;

use super::AttnDims;
use crate::kv::step_meta::{KernelSections, TABLE_FIELD, WINDOW_TABLE_FIELD};
use crate::launch::{Arg, Launch};

/// Warps per attention block (`WARPS` in the kernel).
pub const WARPS: u32 = 4;
/// Query heads per block (`MAX_GROUP` in the kernel).
pub const MAX_GROUP: usize = 8;

/// Head sizes the kernel is instantiated for (32 lanes times 1, 2, 3, 4 or
/// 8 values).
pub fn supports(head_dim: usize) -> bool {
    matches!(head_dim, 32 | 64 | 96 | 128 | 256)
}

/// The buffers the launches read and write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buf {
    /// `[rows, qkv_width]` activations, each row its token's q, k, v heads.
    Qkv,
    KPool,
    VPool,
    /// The step's packed metadata, u32 (`StepMeta::kernel`).
    Meta,
    /// `num_heads` f32 sink logits, or one placeholder value.
    Sinks,
    /// `[rows, num_heads * head_dim]` in the activations' dtype.
    Out,
    /// Split rows' parts: (max, sum) and unnormalised values, f32.
    PartMl,
    PartAcc,
}

/// A layer's launches, and the f32 elements of the part buffers they
/// share (1, an unused placeholder, where no row is split).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub launches: Vec<Launch<Buf>>,
    pub part_ml_len: usize,
    pub part_acc_len: usize,
}

/// The step's shape, as the launches need it.
#[derive(Debug, Clone, Copy)]
pub struct StepShape {
    pub dims: AttnDims,
    pub at: KernelSections,
    /// The step's rows (tokens).
    pub rows: usize,
    /// The longest context any row sees.
    pub max_context: usize,
    /// The GPU's multiprocessors, which decide whether rows are split.
    pub sms: usize,
    pub has_sinks: bool,
}

/// The cache write, the attention, and (for split rows) the merge, for
/// activations of dtype `act` and a pool of dtype `pool`. The head size
/// must be one [`supports`] takes.
pub fn plan(s: StepShape, act: DType, pool: DType) -> Plan {
    let d = s.dims;
    let (q, p) = (act.as_str(), pool.as_str());
    let i = |x: usize| x as i32;
    let (k_at, v_at) = d.kv_offsets();
    let (stride, kv_dim) = (i(d.qkv_width()), i(d.num_kv_heads * d.head_dim));
    let windowed = d.window.is_some();
    let slots = i(match windowed {
        true => s.at.window_slots,
        false => s.at.slots,
    });
    let rows = s.rows as u32;
    let mut launches = Vec::with_capacity(3);

    // Cache write: one block per new row, of min(kv_dim, 256) threads
    // striding over the row's `kv_dim` K and V values (the kernel strides by
    // blockDim, so any width works). No shared memory.
    launches.push(Launch {
        kernel: format!("paged_write_{q}_{p}"),
        grid: (rows, 1, 1),
        block: ((d.num_kv_heads * d.head_dim).min(256) as u32, 1, 1),
        args: vec![
            Arg::Buf(Buf::Qkv),
            Arg::I32(stride),
            Arg::I32(i(k_at)),
            Arg::I32(i(v_at)),
            Arg::I32(kv_dim),
            Arg::Buf(Buf::Meta),
            Arg::I32(slots),
            Arg::Buf(Buf::KPool),
            Arg::Buf(Buf::VPool),
        ],
    });

    // Attention: a block per (row, KV head and subgroup of at most
    // MAX_GROUP query heads, part of the row's keys), WARPS warps each
    // (exactly: the kernel strides keys and sizes its shared arrays by
    // WARPS and is compiled with `__launch_bounds__(WARPS * 32)`). Its
    // shared memory is static (the warps' states, about 4 KiB at head size
    // 256), so no dynamic bytes.
    let subgroups = d.group().div_ceil(MAX_GROUP);
    let blocks = s.rows * d.num_kv_heads * subgroups;
    let parts = super::split::parts(blocks, s.sms, s.max_context);
    let hd = d.head_dim;
    let split_len = |per: usize| match parts {
        1 => 1,
        _ => s.rows * d.num_heads * parts * per,
    };
    let table = i(match windowed {
        true => WINDOW_TABLE_FIELD,
        false => TABLE_FIELD,
    });
    let has_sinks = i32::from(s.has_sinks);
    launches.push(Launch {
        kernel: format!("paged_attend_{q}_{p}_{hd}"),
        grid: (rows, (d.num_kv_heads * subgroups) as u32, parts as u32),
        block: (WARPS * 32, 1, 1),
        args: vec![
            Arg::Buf(Buf::Qkv),
            Arg::I32(stride),
            Arg::Buf(Buf::KPool),
            Arg::Buf(Buf::VPool),
            Arg::Buf(Buf::Meta),
            Arg::I32(i(s.at.seqs)),
            Arg::I32(i(s.at.row_seq)),
            Arg::I32(i(s.at.row_end)),
            Arg::I32(table),
            Arg::I32(i(d.num_heads)),
            Arg::I32(i(d.num_kv_heads)),
            Arg::I32(i(d.block_size)),
            Arg::I32(i(d.window.unwrap_or(0))),
            Arg::F32(1.0 / (hd as f32).sqrt()),
            Arg::I32(i(s.max_context.div_ceil(parts))),
            Arg::Buf(Buf::Sinks),
            Arg::I32(has_sinks),
            Arg::Buf(Buf::Out),
            Arg::Buf(Buf::PartMl),
            Arg::Buf(Buf::PartAcc),
        ],
    });

    // Merge: a block per (row, query head), a thread per value of the head
    // (`hd <= 256`), each reading its column of every part. No shared
    // memory.
    if parts > 1 {
        launches.push(Launch {
            kernel: format!("paged_combine_{q}"),
            grid: (rows, d.num_heads as u32, 1),
            block: (hd as u32, 1, 1),
            args: vec![
                Arg::Buf(Buf::PartMl),
                Arg::Buf(Buf::PartAcc),
                Arg::I32(i(parts)),
                Arg::I32(i(hd)),
                Arg::Buf(Buf::Sinks),
                Arg::I32(has_sinks),
                Arg::Buf(Buf::Out),
            ],
        });
    }
    Plan {
        launches,
        part_ml_len: split_len(2),
        part_acc_len: split_len(hd),
    }
}
