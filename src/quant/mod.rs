//! Quantized weight matrices (the GGUF block types of [`formats`]) with
//! integer matmul kernels.
//!
//! Layout: at load, weights are repacked into tiles of 16 output rows whose
//! 32-value blocks are interleaved 4 bytes at a time, so one 512-bit register
//! holds 4 inputs of all 16 rows and one broadcast activation word feeds 16
//! dot products (`vpdpbusd`). Scales stay in the file's f16 and small
//! integers (converted in registers), so a tile costs about the file's bytes
//! per row and block: at batch 1 the kernel is bound by memory bandwidth.
//!
//! Arithmetic: activations are quantized per call to 8 bits, with one scale
//! per 32 inputs for the per-32 types (carrying `d` and `d * Σq`, which fold
//! a block's minimum into one multiply-add) and one per 256 for the K-quants
//! (GGML's Q8_K, carrying sums per 16 and 32): a K-quant block's sub-block
//! sums, weighted by their integer scales and minima, then stay integers
//! until one conversion per 256 inputs.
//!
//! Tiling and threads: a tile (16 x k weights, ≤ 16 KiB for the model's
//! shapes) stays in L1 while 8 activation rows at a time run against it, so a
//! weight byte is read from memory once per call however many rows are
//! batched. Threads claim chunks of tiles from a shared counter. A call from
//! outside the rayon pool enters it only when big enough to pay for the
//! hand-off (~20 µs), so small batched calls are fastest when the model is
//! driven from a pool thread (e.g. inside `rayon::scope`).

mod act;
#[cfg(target_arch = "x86_64")]
mod amx;
pub mod bf16;
pub(crate) mod formats;
mod generic;
mod grouped;
pub mod mxfp4;
mod super_scales;
#[cfg(test)]
mod tests;
mod weight_buf;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::cell::RefCell;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use candle_core::quantized::QTensor;
use half::f16;
use rayon::prelude::*;

use act::{ActBlocks, QuantActs};
use formats::{Format, Geometry};
pub use grouped::{matmul_grouped, GroupedJob};
pub(crate) use weight_buf::{WeightBuf, HUGE, LINE};

/// Output rows per interleaved tile: one 512-bit register of i32 lanes.
pub(crate) const TILE: usize = 16;
/// Values per quantization block (both formats and the activations).
pub(crate) const QK: usize = 32;
/// Activation rows per pass over the tiles: bounds the quantized activations a
/// task streams per tile (≤ 256 x k bytes) so they stay in L2.
const M_BLOCK: usize = 256;
/// Multiply-adds from which a call made on a rayon thread is split over the
/// pool: below it, waking a sleeping worker costs more than it saves.
/// At 256K, SmolLM2's 576x576 projections split too: its one-stream decode
/// measured ~8% faster than at 512K (seven alternating runs on the 2-core
/// host); 128K was slower, as were 2M and 8M in an earlier session.
const PAR_MIN_MACS: usize = 1 << 18;
/// Multiply-adds from which a call made outside the pool moves into it: that
/// costs a cross-thread wake-up and hand-back, measured ~20 µs on the 2-core
/// host, which a core spends on ~5M multiply-adds.
const PAR_MIN_MACS_OUTSIDE: usize = 1 << 23;
/// Multiply-adds per chunk of tiles claimed by a thread (~0.5 µs of one core).
const PAR_CHUNK_MACS: usize = 1 << 17;

/// Which CPU code path wick's quantized matmuls run (`--cpu-kernel`). All
/// compute the same integer block sums; only the float rounding of scaling
/// and summing them differs.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Kernel {
    /// The fastest path the running CPU supports.
    #[default]
    Auto,
    /// Portable code (what CPUs without the SIMD paths run).
    Generic,
    /// AVX2 with FMA and F16C (x86-64).
    Avx2,
    /// AVX-512 F, BW and VNNI (x86-64).
    Avx512,
}

impl Kernel {
    /// Whether this CPU has the instructions this choice names.
    pub fn runs_here(self) -> bool {
        self.isa().is_ok()
    }

    /// The code path this choice runs on this CPU; an error when the CPU
    /// lacks the instructions it names.
    pub(crate) fn isa(self) -> candle_core::Result<Isa> {
        let unsupported = || {
            candle_core::Error::Msg(format!(
                "this CPU cannot run the {self:?} kernels; use auto or generic"
            ))
        };
        match self {
            Kernel::Auto => Ok(Isa::detect()),
            Kernel::Generic => Ok(Isa::Generic),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 if x86::avx2_supported() => Ok(Isa::Avx2),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 if x86::avx512_vnni_supported() => Ok(Isa::Avx512Vnni),
            Kernel::Avx2 | Kernel::Avx512 => Err(unsupported()),
        }
    }
}

/// The concrete code path a call runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    Generic,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
}

impl Isa {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if x86::avx512_vnni_supported() {
                return Isa::Avx512Vnni;
            }
            if x86::avx2_supported() {
                return Isa::Avx2;
            }
        }
        Isa::Generic
    }
}

/// Runs `$body` with `$L` the tile layout of `$format`.
macro_rules! with_layout {
    ($format:expr, $L:ident => $body:expr) => {
        match $format {
            Format::Q4_0 => {
                type $L = formats::NibDirectD;
                $body
            }
            Format::Q4_1 => {
                type $L = formats::NibDirect;
                $body
            }
            Format::Q5_0 => {
                type $L = formats::Nib5DirectD;
                $body
            }
            Format::Q5_1 => {
                type $L = formats::Nib5Direct;
                $body
            }
            Format::Q8_0 => {
                type $L = formats::ByteDirect;
                $body
            }
            Format::Mxfp4 => {
                type $L = formats::LutDirectExp;
                $body
            }
            Format::Q4K => {
                type $L = formats::NibSuper32;
                $body
            }
            Format::Q5K => {
                type $L = formats::Nib5Super32;
                $body
            }
            Format::Q6K => {
                type $L = formats::Nib6Super16Offset;
                $body
            }
            Format::Q2K => {
                type $L = formats::NibSuper16;
                $body
            }
            Format::Q3K => {
                type $L = formats::NibSuper16Offset;
                $body
            }
        }
    };
}

/// A quantized `n x k` weight matrix (`n` outputs, `k` inputs), repacked for the
/// kernels in this module.
pub struct QuantMatrix {
    format: Format,
    geom: Geometry,
    n: usize,
    k: usize,
    /// The tiles are `len` bytes from `start` on: a buffer of the matrix's
    /// own, or its place in one shared with others ([`share_pages`]).
    data: Arc<WeightBuf>,
    start: usize,
    len: usize,
    /// The code path [`matmul`](Self::matmul) runs.
    isa: Isa,
}

impl std::fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QuantMatrix({:?}, {}x{})", self.format, self.n, self.k)
    }
}

thread_local! {
    /// Activation scratch reused across calls on a thread.
    static SCRATCH: RefCell<QuantActs> = RefCell::new(QuantActs::default());
}

impl QuantMatrix {
    /// Repacks a 2-D tensor of shape (n, k) of one of the [`formats`];
    /// `None` for other dtypes, or when a block cannot be held exactly.
    pub fn from_qtensor(t: &QTensor) -> candle_core::Result<Option<QuantMatrix>> {
        let (n, k) = t.shape().dims2()?;
        match Format::of(t.dtype()) {
            Some(format) => Self::from_ggml(format, n, k, &t.data()?),
            None => Ok(None),
        }
    }

    /// Quantizes row-major `n x k` f32 weights to Q8_0 (GGML's rounding).
    pub fn quantize_q8_0(weights: &[f32], n: usize, k: usize) -> candle_core::Result<QuantMatrix> {
        if weights.len() != n * k || k == 0 || !k.is_multiple_of(QK) {
            candle_core::bail!("quantize_q8_0: {} values for {n}x{k}", weights.len());
        }
        let mut raw = Vec::with_capacity(n * k / QK * 34);
        for block in weights.chunks_exact(QK) {
            let amax = block.iter().fold(0f32, |a, &v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            raw.extend_from_slice(&f16::from_f32(d).to_le_bytes());
            raw.extend(block.iter().map(|&v| (v * id).round() as i8 as u8));
        }
        Self::from_ggml(Format::Q8_0, n, k, &raw)?
            .ok_or_else(|| candle_core::Error::Msg("Q8_0 blocks are always held".into()))
    }

    /// Repacks GGML row-major blocks into tiles, zero-padding the last tile.
    fn from_ggml(
        format: Format,
        n: usize,
        k: usize,
        raw: &[u8],
    ) -> candle_core::Result<Option<Self>> {
        Ok(Self::stack_from_ggml(format, 1, n, k, raw)?.map(|mut v| v.remove(0)))
    }

    /// Repacks a stack of `count` GGML `n x k` matrices (a GGUF's 3-D expert
    /// tensor, `[count, n, k]`) into one buffer, each matrix at its own
    /// cache-line-aligned place in it: one allocation, in huge pages, rather
    /// than one per expert.
    pub fn stack_from_qtensor(t: &QTensor) -> candle_core::Result<Option<Vec<QuantMatrix>>> {
        let (count, n, k) = t.shape().dims3()?;
        match Format::of(t.dtype()) {
            Some(format) => Self::stack_from_ggml(format, count, n, k, &t.data()?),
            None => Ok(None),
        }
    }

    fn stack_from_ggml(
        format: Format,
        count: usize,
        n: usize,
        k: usize,
        raw: &[u8],
    ) -> candle_core::Result<Option<Vec<Self>>> {
        let format = format.narrowest(raw);
        let (inputs, ggml_block) = (format.block_inputs(), format.ggml_block_bytes());
        let nb = k / inputs;
        let src_len = n * nb * ggml_block;
        if k == 0 || !k.is_multiple_of(inputs) || raw.len() != count * src_len {
            candle_core::bail!(
                "{format:?} matrix {count}x{n}x{k}: expected {} bytes, got {}",
                count * src_len,
                raw.len()
            );
        }
        let geom = format.geometry();
        let len = n.div_ceil(TILE) * nb * geom.block_bytes;
        let stride = len.next_multiple_of(LINE);
        let mut data = WeightBuf::zeroed(stride * count);
        // Tiles in parallel (a model's load is mostly this): each is 16 rows
        // of one matrix, its own run of the buffer.
        let tile_bytes = nb * geom.block_bytes;
        let held = data
            .as_mut_slice()
            .par_chunks_mut(stride)
            .zip(raw.par_chunks(src_len))
            .flat_map(|(packed, raw)| {
                packed[..len]
                    .par_chunks_mut(tile_bytes)
                    .enumerate()
                    .map(move |(t, tile)| (t, tile, raw))
            })
            .try_for_each(|(t, tile, raw)| {
                for row in t * TILE..n.min((t + 1) * TILE) {
                    for b in 0..nb {
                        let src = &raw[(row * nb + b) * ggml_block..][..ggml_block];
                        let dst = &mut tile[b * geom.block_bytes..][..geom.block_bytes];
                        geom.encode(&format.decode(src)?, row % TILE, dst);
                    }
                }
                Some(())
            });
        if held.is_none() {
            return Ok(None);
        }
        let data = Arc::new(data);
        Ok(Some(
            (0..count)
                .map(|e| Self {
                    format,
                    geom,
                    n,
                    k,
                    data: data.clone(),
                    start: e * stride,
                    len,
                    isa: Isa::detect(),
                })
                .collect(),
        ))
    }

    /// Runs [`matmul`](Self::matmul) on `kernel`; an error when this CPU
    /// lacks its instructions.
    pub fn with_kernel(self, kernel: Kernel) -> candle_core::Result<Self> {
        Ok(Self {
            isa: kernel.isa()?,
            ..self
        })
    }

    /// Output rows.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Inputs per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The repacked weights as the kernels read them: every byte a
    /// one-row product must stream from memory.
    pub fn bytes(&self) -> &[u8] {
        &self.data.as_slice()[self.start..][..self.len]
    }

    /// The tile-blocks of tile `t`.
    fn tile(&self, t: usize) -> &[u8] {
        let len = self.k / (self.geom.subs * QK) * self.geom.block_bytes;
        &self.bytes()[t * len..(t + 1) * len]
    }

    /// Dequantizes weight row `row` into `out[..k]`, bit-identical to GGML's
    /// dequantization.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        assert!(row < self.n, "row {row} out of {}", self.n);
        assert_eq!(out.len(), self.k, "dequantize_row: output length");
        let r = row % TILE;
        let offset = self.format.offset();
        let blocks = self.tile(row / TILE).chunks_exact(self.geom.block_bytes);
        let subs = blocks.flat_map(|blk| (0..self.geom.subs).map(move |j| (blk, j)));
        for ((blk, j), o) in subs.zip(out.chunks_exact_mut(QK)) {
            let sub = self.geom.decode_row(blk, j, r);
            for (i, (o, &q)) in o.iter_mut().zip(&sub.q).enumerate() {
                let (s, m) = (sub.s[i / 16], sub.m[i / 16]);
                // GGML scales an offset quant in one step: s * (q - 32).
                *o = match offset {
                    Some(off) => s * (q as f32 - off),
                    None => q as f32 * s + m,
                };
            }
        }
    }

    /// `out[m, n] = x[m, k] · Wᵀ` on the matrix's kernel (by default the
    /// fastest for this CPU, see [`with_kernel`](Self::with_kernel)).
    ///
    /// Panics if `x.len() != m * k` or `out.len() != m * n`.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        self.matmul_isa(self.isa, x, m, out)
    }

    /// [`matmul`](Self::matmul) into a new vector, which is not zeroed first:
    /// the kernels write every output (zeroing cost ~2% of a decode step).
    pub fn matmul_to_vec(&self, x: &[f32], m: usize) -> Vec<f32> {
        let len = m * self.n;
        let mut out = Vec::with_capacity(len);
        self.matmul_raw(self.isa, x, m, OutPtr(out.as_mut_ptr()));
        // SAFETY: the capacity holds m * n values and every tile's task wrote
        // all its columns of every row (`OutTile::write` per row and tile).
        unsafe { out.set_len(len) };
        out
    }

    /// [`matmul`](Self::matmul) on a chosen kernel, which this CPU must run.
    pub fn matmul_with(&self, kernel: Kernel, x: &[f32], m: usize, out: &mut [f32]) {
        let isa = kernel.isa().expect("a kernel this CPU runs");
        self.matmul_isa(isa, x, m, out)
    }

    fn matmul_isa(&self, isa: Isa, x: &[f32], m: usize, out: &mut [f32]) {
        assert_eq!(
            out.len(),
            m * self.n,
            "matmul: output is not {m} x {}",
            self.n
        );
        self.matmul_raw(isa, x, m, OutPtr(out.as_mut_ptr()))
    }

    /// The product into `out`, which must have room for `m * n` values.
    fn matmul_raw(&self, isa: Isa, x: &[f32], m: usize, out_ptr: OutPtr) {
        assert_eq!(
            x.len(),
            m * self.k,
            "matmul: activations are not {m} x {}",
            self.k
        );
        if m == 0 || self.n == 0 {
            return;
        }
        let macs = m * self.n * self.k;
        let threads = rayon::current_num_threads();
        let in_pool = rayon::current_thread_index().is_some();
        if threads > 1 && !in_pool && macs >= PAR_MIN_MACS_OUTSIDE {
            // Enter the pool once for the whole call rather than once per
            // parallel loop.
            return rayon::scope(|_| self.matmul_raw(isa, x, m, out_ptr));
        }
        let parallel = threads > 1 && in_pool && macs >= PAR_MIN_MACS;
        // Taken rather than borrowed: a nested call on this thread (rayon work
        // stealing while we wait) then just allocates its own.
        let mut acts = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
        let blocks = if self.geom.scales.is_super() {
            ActBlocks::B256
        } else {
            ActBlocks::B32
        };
        acts.quantize(x, m, self.k, blocks, isa, parallel);
        let tiles = self.n.div_ceil(TILE);
        if parallel {
            let rows = m.min(M_BLOCK);
            let chunk = (PAR_CHUNK_MACS / (rows * TILE * self.k)).clamp(1, tiles);
            let split = Split::new(tiles, threads, chunk);
            fan_out(0, threads, &|t| {
                split.run(t, |r| self.run_tiles(isa, &acts, r, out_ptr))
            });
        } else {
            self.run_tiles(isa, &acts, 0..tiles, out_ptr);
        }
        SCRATCH.with(|s| *s.borrow_mut() = acts);
    }

    /// Runs tiles `tiles` against all activation rows, `M_BLOCK` rows at a time.
    fn run_tiles(&self, isa: Isa, acts: &QuantActs, tiles: Range<usize>, out: OutPtr) {
        for m0 in (0..acts.m()).step_by(M_BLOCK) {
            let rows = m0..(m0 + M_BLOCK).min(acts.m());
            for t in tiles.clone() {
                let job = TileJob {
                    tile: self.tile(t),
                    acts,
                    rows: rows.clone(),
                    out: OutTile {
                        // SAFETY: column t * 16 < n lies inside the first output row.
                        ptr: unsafe { out.0.add(t * TILE) },
                        ld: self.n,
                        cols: (self.n - t * TILE).min(TILE),
                    },
                };
                with_layout!(self.format, L => match isa {
                    Isa::Generic => generic::tile::<L>(&job),
                    // SAFETY (x86 arms): these `Isa`s are only chosen after
                    // runtime detection of their features.
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => unsafe { x86::tile_avx2::<L>(&job) },
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512Vnni => unsafe { x86::tile_avx512::<L>(&job) },
                });
            }
        }
    }
}

/// Moves the matrices smaller than a huge page into one buffer, in the order
/// given, so that they too are read from 2 MiB pages.
///
/// Each matrix of a small model (SmolLM2's are 0.1-1.2 MB) otherwise has its
/// own 4 KiB-paged allocation; as one buffer in the order a forward reads
/// them, single-stream decode measured ~5% faster on the 2-core host.
pub fn share_pages<'a>(matrices: impl IntoIterator<Item = &'a mut QuantMatrix>) {
    let small: Vec<&mut QuantMatrix> = matrices.into_iter().filter(|m| m.len < HUGE).collect();
    let place = |len: usize| len.next_multiple_of(LINE);
    let total: usize = small.iter().map(|m| place(m.len)).sum();
    if total < HUGE {
        return;
    }
    let mut buf = WeightBuf::zeroed(total);
    let mut start = 0;
    let mut starts = Vec::with_capacity(small.len());
    for m in &small {
        buf.as_mut_slice()[start..][..m.len].copy_from_slice(m.bytes());
        starts.push(start);
        start += place(m.len);
    }
    let buf = Arc::new(buf);
    for (m, start) in small.into_iter().zip(starts) {
        m.data = buf.clone();
        m.start = start;
    }
}

/// Runs `work(t)` for `t` in `first..first + threads` on pool threads (a join
/// tree: nothing on the heap).
fn fan_out(first: usize, threads: usize, work: &(impl Fn(usize) + Sync)) {
    if threads <= 1 {
        work(first);
    } else {
        let half = threads / 2;
        rayon::join(
            || fan_out(first, half, work),
            || fan_out(first + half, threads - half, work),
        );
    }
}

/// Most regions a call's tiles are split into.
const MAX_REGIONS: usize = 16;

/// One contiguous region of tiles per thread, claimed a chunk at a time.
///
/// A thread walks its own region first, so each core streams sequential
/// memory and writes its own output columns (interleaving chunks between
/// cores measured up to 2x slower), then takes chunks left in the others'
/// regions, so a thread that wakes late or is slowed only costs a chunk.
struct Split {
    next: [AtomicUsize; MAX_REGIONS],
    end: [usize; MAX_REGIONS],
    regions: usize,
    chunk: usize,
}

impl Split {
    fn new(tiles: usize, threads: usize, chunk: usize) -> Self {
        let regions = threads.clamp(1, MAX_REGIONS);
        let bound = |r: usize| tiles * r / regions;
        Split {
            next: std::array::from_fn(|r| AtomicUsize::new(bound(r))),
            end: std::array::from_fn(|r| bound(r + 1)),
            regions,
            chunk,
        }
    }

    /// Thread `t`'s share: its region, then whatever the others left.
    fn run(&self, t: usize, f: impl Fn(Range<usize>)) {
        for r in (0..self.regions).map(|i| (t + i) % self.regions) {
            loop {
                let start = self.next[r].fetch_add(self.chunk, Ordering::Relaxed);
                if start >= self.end[r] {
                    break;
                }
                f(start..(start + self.chunk).min(self.end[r]));
            }
        }
    }
}

/// The output base pointer shared by the tasks of one call.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint column ranges (distinct tiles) of the output,
// which outlives the parallel region.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Columns `[0, cols)` of one tile's slice of the `[m, ld]` output.
pub(crate) struct OutTile {
    ptr: *mut f32,
    ld: usize,
    cols: usize,
}

impl OutTile {
    /// Writes one activation row's results for this tile.
    pub(crate) fn write(&self, row: usize, v: &[f32; TILE]) {
        // SAFETY: `row` comes from the job's row range (< m) and `cols` is
        // clipped to n, so this stays inside the output; only this tile's task
        // writes these columns.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(row * self.ld), self.cols) }
    }
}

/// One weight tile against a range of quantized activation rows.
pub(crate) struct TileJob<'a> {
    /// The tile's `k / 32` tile-blocks.
    pub tile: &'a [u8],
    pub acts: &'a QuantActs,
    pub rows: Range<usize>,
    pub out: OutTile,
}
