//! wick's CUDA kernels against the CPU path: on the host build of the
//! kernels (`crates/cuda-host`) in every run, and, built with `--features
//! cuda`, on a GPU too where one opens (those skip, saying so, where none
//! does). Both run the launch plans the GPU path runs
//! (`attention::launch::plan`, `sampling::argmax::launch`), so the host
//! build checks the grids and argument lists as well as the kernels.
//!
//! - Paged attention and the cache write, against the host kernel on the
//!   same steps: fresh random inputs every run (the seed is printed), pools
//!   and outputs poisoned with NaN first, ragged batches mixing prompt
//!   chunks and decode rows, a prefix hit, a context long enough to split
//!   rows across blocks, sliding windows, more query heads per KV head
//!   than one block takes, and attention sinks (gpt-oss's), with rows
//!   split and not. The host build runs a shorter long prompt (its fibers
//!   take microseconds a warp shuffle) and a GPU of few multiprocessors,
//!   so that rows split there too.
//! - The greedy pick: each row's argmax against the host's, with ties,
//!   NaN and -inf planted, vocabularies from below a warp to 262k.
//! - The emulator itself: a kernel missing a `__syncthreads` fails under
//!   it, and so do a warp shuffle naming a lane that returned and a barrier
//!   only some threads reach; its warp shuffles against CUDA's rules.
//! - The gated delta rule (Qwen3.5's linear attention) against its CPU
//!   twin, over steps of sequences starting and carrying on in a pool.
//! - The routed experts of a MoE block (routing, grouped expert products,
//!   the weighted sum) against the block computed from the dequantized
//!   weights, for every block type the kernels read.
//! - Whole models on a GPU: logits against transformers' from the tiny
//!   fixtures.

mod common;

use std::ffi::c_void;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};
use wick::attention::launch::{plan, Buf, StepShape};
use wick::attention::{paged_attention, step_meta, AttnDims};
use wick::kv::cache::{KvCache, KvDtype, KvLayout};
use wick::kv::step_meta::MetaBuffers;
use wick::launch::{Arg, Launch};
use wick::models::elementwise::{Act, NormBuf};
use wick::models::{FlatBatch, LogitRows};
use wick::sampling::argmax::argmax;
use wick::sampling::device::{self, DeviceRow};
use wick::sampling::params::SamplingParams;
use wick::sampling::sampler::Sampler;
use wick_cuda_host::Value;

#[cfg(feature = "cuda")]
fn gpu() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("skipping: no CUDA device ({e})");
            None
        }
    }
}

/// A new seed every run, printed so that a failure can be replayed.
fn fresh_seed() -> u64 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("seed {seed}");
    seed
}

/// A small LCG: uniform values in [-1, 1).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn tensor(&mut self, rows: usize, cols: usize) -> Tensor {
        let data: Vec<f32> = (0..rows * cols).map(|_| self.next()).collect();
        Tensor::from_vec(data, (rows, cols), &Device::Cpu).unwrap()
    }
}

/// A sequence: its blocks, and the positions each step feeds (empty: not
/// in that step).
struct Seq {
    table: Vec<u32>,
    steps: Vec<std::ops::Range<usize>>,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    head_dim: usize,
    num_heads: usize,
    num_kv_heads: usize,
    window: Option<usize>,
    /// Activations and the kernel's pool's dtype.
    act: DType,
    pool: DType,
    tol: f32,
    /// A random sink logit per query head.
    sinks: bool,
    /// Each prompt chunk's middle third is a span its rows see whole (a
    /// Gemma 3 image's tokens).
    seen_whole: bool,
}

/// Where the kernels run, and how long the schedule's long prompt is there.
#[derive(Clone)]
enum Target {
    /// The host build, as a GPU of `HOST_SMS` multiprocessors.
    Host,
    #[cfg(feature = "cuda")]
    Gpu(Device),
}

/// Few enough that the host build's decode rows split into parts.
const HOST_SMS: usize = 8;

impl Target {
    fn long_prompt(&self) -> usize {
        match self {
            Target::Host => 96,
            #[cfg(feature = "cuda")]
            Target::Gpu(_) => 1500,
        }
    }
}

/// Five steps: two prompts in chunks, one of `long` tokens; a third
/// sequence whose first block is the first's (a prefix hit); then decode
/// rows, the last steps few enough that rows are split across blocks.
fn schedule(block_size: usize, long: usize) -> Vec<Seq> {
    let blocks =
        |from: u32, n: usize| -> Vec<u32> { (0..n as u32).map(|i| from + 3 * i).collect() };
    let long_table = blocks(1, (long + 4).div_ceil(block_size));
    let short = blocks(0, 2 + 48usize.div_ceil(block_size));
    let mut hit = vec![short[0]];
    hit.extend(blocks(2, 40usize.div_ceil(block_size)));
    let third = long / 3;
    vec![
        Seq {
            table: short,
            steps: vec![0..20, 20..37, 37..38, 38..39, 39..40],
        },
        Seq {
            table: long_table,
            steps: vec![
                0..third,
                third..2 * third,
                2 * third..long,
                long..long + 1,
                long + 1..long + 2,
            ],
        },
        Seq {
            table: hit,
            steps: vec![0..0, block_size..block_size + 14, 30..31, 31..32, 32..33],
        },
    ]
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    let a = a
        .to_dtype(DType::F32)
        .unwrap()
        .to_device(&Device::Cpu)
        .unwrap();
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// A buffer of the host build, in one of the kernels' dtypes.
enum HostBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl HostBuf {
    fn nan(dtype: DType, n: usize) -> Self {
        match dtype {
            DType::F32 => Self::F32(vec![f32::NAN; n]),
            DType::F16 => Self::F16(vec![f16::NAN; n]),
            DType::BF16 => Self::BF16(vec![bf16::NAN; n]),
            other => panic!("no kernel takes {other:?}"),
        }
    }

    /// `t`'s values, converted to `dtype`.
    fn of(t: &Tensor, dtype: DType) -> Self {
        let t = t.to_dtype(dtype).unwrap().flatten_all().unwrap();
        match dtype {
            DType::F32 => Self::F32(t.to_vec1().unwrap()),
            DType::F16 => Self::F16(t.to_vec1().unwrap()),
            DType::BF16 => Self::BF16(t.to_vec1().unwrap()),
            other => panic!("no kernel takes {other:?}"),
        }
    }

    fn ptr(&mut self) -> *mut c_void {
        match self {
            Self::F32(v) => v.as_mut_ptr().cast(),
            Self::F16(v) => v.as_mut_ptr().cast(),
            Self::BF16(v) => v.as_mut_ptr().cast(),
        }
    }

    fn to_f32(&self) -> Vec<f32> {
        match self {
            Self::F32(v) => v.clone(),
            Self::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            Self::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
        }
    }
}

/// Runs `launch` on the host build, each buffer argument resolved by `buf`.
/// Panics with the emulator's message (kernel, block, seed) and `what`.
fn run_on_host<B: Copy>(
    launch: &Launch<B>,
    seed: u64,
    mut buf: impl FnMut(B) -> *mut c_void,
    what: &str,
) {
    let args: Vec<Value> = launch
        .args
        .iter()
        .map(|a| match *a {
            Arg::Buf(b) => Value::Ptr(buf(b)),
            Arg::I32(x) => Value::I32(x),
            Arg::U32(x) => Value::U32(x),
            Arg::F32(x) => Value::F32(x),
        })
        .collect();
    let (g, b) = (launch.grid, launch.block);
    // SAFETY: the plan's arguments are the kernel's parameters in order and
    // type (the same list the GPU path pushes), and `buf` gives buffers of
    // the sizes the plan assumes for the step (see each caller).
    unsafe {
        wick_cuda_host::launch(
            &launch.kernel,
            [g.0, g.1, g.2],
            [b.0, b.1, b.2],
            seed,
            &args,
        )
    }
    .unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// The kernel's side of one case: its pools, kept across the steps.
enum Pools {
    /// `packer`, a tensor pool on the CPU, only packs each step for the
    /// kernel: the kernel's pools are `k` and `v`.
    Host {
        packer: KvCache,
        k: HostBuf,
        v: HostBuf,
    },
    #[cfg(feature = "cuda")]
    Gpu(KvCache),
}

fn run_case(target: &Target, case: Case, seed: u64) {
    let block_size = 16;
    let dims = AttnDims {
        num_heads: case.num_heads,
        num_kv_heads: case.num_kv_heads,
        head_dim: case.head_dim,
        block_size,
        window: case.window,
    };
    let layout = |dtype| KvLayout {
        num_layers: 1,
        num_kv_heads: case.num_kv_heads,
        head_dim: case.head_dim,
        block_size,
        num_blocks: 3 * 96,
        dtype,
        window_kv: None,
    };
    // The host pool holds exactly what the kernel's pool does: f16 for f16,
    // and f32 for values that are exact there (f32, or bf16 activations into
    // a bf16 pool).
    let host_dtype = match case.pool {
        DType::F16 => KvDtype::F16,
        _ => KvDtype::F32,
    };
    let mut host = KvCache::new(layout(host_dtype), &Device::Cpu, false).unwrap();
    let rows = 3 * 96 * block_size;
    let kv_dim = case.num_kv_heads * case.head_dim;
    let mut pools = match target {
        Target::Host => Pools::Host {
            packer: KvCache::new(layout(KvDtype::F32), &Device::Cpu, true).unwrap(),
            k: HostBuf::nan(case.pool, rows * kv_dim),
            v: HostBuf::nan(case.pool, rows * kv_dim),
        },
        #[cfg(feature = "cuda")]
        Target::Gpu(dev) => {
            let mut gpu = KvCache::new(layout(KvDtype::F32), dev, false).unwrap();
            let nan = || {
                Tensor::full(f32::NAN, (rows, kv_dim), dev)
                    .unwrap()
                    .to_dtype(case.pool)
                    .unwrap()
            };
            *gpu.layer_mut(0) = wick::kv::cache::LayerCache::Tensor { k: nan(), v: nan() };
            Pools::Gpu(gpu)
        }
    };

    let mut rng = Lcg(seed);
    // Sinks in [-4, 4): some above every score, some below.
    let sinks = case.sinks.then(|| {
        let s = rng.tensor(1, case.num_heads).flatten_all().unwrap();
        (s * 4.0).unwrap()
    });
    let seqs = schedule(block_size, target.long_prompt());
    let mut split = false;
    let longest = seqs
        .iter()
        .map(|s| s.steps.last().unwrap().end)
        .max()
        .unwrap();
    for step in 0..seqs[0].steps.len() {
        let mut batch = FlatBatch::default();
        for s in seqs.iter().filter(|s| !s.steps[step].is_empty()) {
            let tokens = vec![0; longest];
            let rows = s.steps[step].clone();
            batch.push(&tokens, rows.clone(), s.table.clone(), LogitRows::Last);
            if case.seen_whole && rows.len() >= 3 {
                let third = rows.len() / 3;
                batch.seqs.last_mut().unwrap().seen_whole =
                    std::iter::once(rows.start + third..rows.end - third).collect();
            }
        }
        let t = batch.tokens.len();
        // Activations as the kernel sees them, in f32 for the host.
        let qkv = rng
            .tensor(t, dims.qkv_width())
            .to_dtype(case.act)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let mut host_bufs = MetaBuffers::default();
        let host_meta = step_meta(&mut host_bufs, &batch, &host, None, &Device::Cpu).unwrap();
        let want = paged_attention(&qkv, host.layer_mut(0), &host_meta, dims, sinks.as_ref());
        let want = want.unwrap();

        let mut bufs = MetaBuffers::default();
        let what = format!("{case:?} seed {seed} step {step}");
        let got = match &mut pools {
            Pools::Host { packer, k, v } => {
                let meta = bufs.pack(&batch, packer, None, &Device::Cpu, true).unwrap();
                let (packed, at) = meta.kernel().expect("packed for the kernel");
                let mut packed: Vec<u32> = packed.to_vec1().unwrap();
                let max_context = meta.seqs().iter().map(|s| s.context_len()).max().unwrap();
                let shape = StepShape {
                    dims,
                    at,
                    rows: t,
                    max_context,
                    sms: HOST_SMS,
                    has_sinks: sinks.is_some(),
                };
                let plan = plan(shape, case.act, case.pool);
                split |= plan.launches.len() == 3;
                let mut q = HostBuf::of(&qkv, case.act);
                let mut sink_values: Vec<f32> = match &sinks {
                    Some(s) => s.to_vec1().unwrap(),
                    None => vec![0.0],
                };
                let mut out = HostBuf::nan(case.act, t * dims.num_heads * dims.head_dim);
                let mut part_ml = vec![f32::NAN; plan.part_ml_len];
                let mut part_acc = vec![f32::NAN; plan.part_acc_len];
                for (i, l) in plan.launches.iter().enumerate() {
                    let buf = |b| match b {
                        Buf::Qkv => q.ptr(),
                        Buf::KPool => k.ptr(),
                        Buf::VPool => v.ptr(),
                        Buf::Meta => packed.as_mut_ptr().cast(),
                        Buf::Sinks => sink_values.as_mut_ptr().cast(),
                        Buf::Out => out.ptr(),
                        Buf::PartMl => part_ml.as_mut_ptr().cast(),
                        Buf::PartAcc => part_acc.as_mut_ptr().cast(),
                    };
                    run_on_host(l, seed.wrapping_add(i as u64), buf, &what);
                }
                Tensor::from_vec(out.to_f32(), want.dims(), &Device::Cpu).unwrap()
            }
            #[cfg(feature = "cuda")]
            Pools::Gpu(gpu) => {
                let Target::Gpu(dev) = target else {
                    unreachable!()
                };
                let meta = step_meta(&mut bufs, &batch, gpu, None, dev).unwrap();
                assert!(
                    meta.kernel().is_some(),
                    "{case:?}: not packed for the kernel"
                );
                let out = Tensor::full(f32::NAN, (t, dims.num_heads * dims.head_dim), dev)
                    .unwrap()
                    .to_dtype(case.act)
                    .unwrap();
                let wick::kv::cache::LayerCache::Tensor { k, v } = gpu.layer_mut(0) else {
                    unreachable!()
                };
                let q = qkv.to_dtype(case.act).unwrap().to_device(dev).unwrap();
                let gpu_sinks = sinks.as_ref().map(|s| s.to_device(dev).unwrap());
                wick::attention::cuda::write_and_attend_into(
                    &q,
                    k,
                    v,
                    &meta,
                    dims,
                    gpu_sinks.as_ref(),
                    &out,
                )
                .unwrap();
                out
            }
        };
        let diff = max_diff(&got, &want);
        assert!(
            diff <= case.tol,
            "{what}: max diff {diff} from the host kernel"
        );
    }
    assert!(
        split || !matches!(target, Target::Host),
        "{case:?}: no step split its rows on the host build"
    );
}

/// Every case on `target`.
fn attention_cases(target: &Target) {
    let seed = fresh_seed();
    let base = Case {
        head_dim: 64,
        num_heads: 8,
        num_kv_heads: 2,
        window: None,
        act: DType::F32,
        pool: DType::F32,
        tol: 1e-4,
        sinks: false,
        seen_whole: false,
    };
    let mut cases = Vec::new();
    for head_dim in [32, 64, 96, 128, 256] {
        cases.push(Case { head_dim, ..base });
        cases.push(Case {
            head_dim,
            pool: DType::F16,
            ..base
        });
        cases.push(Case {
            head_dim,
            act: DType::BF16,
            pool: DType::F16,
            tol: 1e-2,
            ..base
        });
        cases.push(Case {
            head_dim,
            act: DType::BF16,
            pool: DType::BF16,
            tol: 1e-2,
            ..base
        });
    }
    // Windows shorter than a block, across blocks, and past a split part;
    // ten query heads per KV head (two blocks each); one KV head per query
    // head.
    for window in [5, 40, target.long_prompt() / 2] {
        cases.push(Case {
            window: Some(window),
            ..base
        });
    }
    cases.push(Case {
        num_heads: 20,
        head_dim: 128,
        ..base
    });
    cases.push(Case {
        num_heads: 4,
        num_kv_heads: 4,
        act: DType::F16,
        pool: DType::F16,
        tol: 5e-3,
        ..base
    });
    // gpt-oss's shape: heads of 64, 8 per KV head, sinks, with and
    // without its 128-token window (the schedule's last steps split rows).
    for window in [None, Some(128)] {
        cases.push(Case {
            num_heads: 16,
            sinks: true,
            window,
            ..base
        });
    }
    // Spans seen whole, alone, under a window and with sinks.
    for (window, sinks) in [(None, false), (Some(40), false), (Some(128), true)] {
        cases.push(Case {
            num_heads: 16,
            seen_whole: true,
            window,
            sinks,
            ..base
        });
    }
    for (i, case) in cases.into_iter().enumerate() {
        run_case(target, case, seed.wrapping_add(i as u64));
    }
}

#[test]
fn paged_attention_on_the_host_build_matches_the_host_kernel() {
    attention_cases(&Target::Host);
}

#[cfg(feature = "cuda")]
#[test]
fn paged_attention_on_the_gpu_matches_the_host_kernel() {
    let Some(dev) = gpu() else { return };
    attention_cases(&Target::Gpu(dev));
}

/// Every row's pick of `logits` (f32 `[rows, vocab]` on the host) on
/// `target`.
fn argmax_on(target: &Target, logits: &Tensor, seed: u64) -> Vec<u32> {
    match target {
        Target::Host => {
            let (rows, vocab) = logits.dims2().unwrap();
            let mut data: Vec<f32> = logits.flatten_all().unwrap().to_vec1().unwrap();
            let mut out = vec![u32::MAX; rows];
            let launch = wick::sampling::argmax::launch(rows, vocab);
            let buf = |b| match b {
                wick::sampling::argmax::Buf::Logits => data.as_mut_ptr().cast(),
                wick::sampling::argmax::Buf::Out => out.as_mut_ptr().cast(),
            };
            run_on_host(&launch, seed, buf, &format!("{rows} rows of {vocab}"));
            out
        }
        #[cfg(feature = "cuda")]
        Target::Gpu(dev) => {
            wick::sampling::argmax::argmax_rows(&logits.to_device(dev).unwrap()).unwrap()
        }
    }
}

/// Fresh random rows every run (the seed is printed); in each row in turn a
/// tie for the largest value planted around it, NaN planted (at id 0 too),
/// every value -inf, every value NaN. f32 and bf16 logits, the latter
/// against the host's pick of the same bf16 values. Runs of the same size
/// follow one another, so a row the kernel left unwritten would show a
/// stale id (on the host build, the poison it starts with).
fn argmax_cases(target: &Target) {
    let seed = fresh_seed();
    let mut rng = Lcg(seed);
    let id =
        |rng: &mut Lcg, vocab: usize| ((rng.next() + 1.0) * 0.5 * vocab as f32) as usize % vocab;
    for (rows, vocab) in [
        (1, 7),
        (5, 49152),
        (300, 128256),
        (300, 128256),
        (4, 262144),
    ] {
        let mut data: Vec<f32> = (0..rows * vocab).map(|_| rng.next()).collect();
        for (r, row) in data.chunks_mut(vocab).enumerate() {
            match r % 4 {
                0 => {
                    let top = row[argmax(row) as usize];
                    let (a, b) = (id(&mut rng, vocab), id(&mut rng, vocab));
                    row[a] = top;
                    row[b] = top;
                }
                1 => {
                    row[0] = f32::NAN;
                    let a = id(&mut rng, vocab);
                    row[a] = f32::NAN;
                }
                2 => row.fill(f32::NEG_INFINITY),
                _ => row.fill(f32::NAN),
            }
        }
        let cpu = Tensor::from_vec(data, (rows, vocab), &Device::Cpu).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            let values = cpu.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap();
            let want: Vec<u32> = values
                .to_vec2::<f32>()
                .unwrap()
                .iter()
                .map(|r| argmax(r))
                .collect();
            let got = argmax_on(target, &values, seed);
            assert_eq!(got, want, "{rows} rows of {vocab}, {dtype:?}, seed {seed}");
        }
    }
}

#[test]
fn argmax_on_the_host_build_matches_the_host() {
    argmax_cases(&Target::Host);
}

#[cfg(feature = "cuda")]
#[test]
fn argmax_on_the_gpu_matches_the_host() {
    let Some(dev) = gpu() else { return };
    argmax_cases(&Target::Gpu(dev));
}

/// What the device sampler returned for one row.
#[derive(Debug, PartialEq)]
struct Drawn {
    id: u32,
    logprob: Option<f32>,
    top: Vec<(u32, f32)>,
}

/// Samples `logits` (f32 `[rows, vocab]` on the host) under `rows` on
/// `target`, through the launch the GPU path runs.
fn device_sample(
    target: &Target,
    logits: &[f32],
    vocab: usize,
    rows: &[DeviceRow],
    seed: u64,
) -> Vec<Drawn> {
    let n = rows.len();
    let max_top = rows.iter().filter_map(|r| r.logprobs).max().unwrap_or(0);
    let mut params = device::pack(rows);
    let mut input = logits.to_vec();
    let mut work = vec![f32::NAN; n * vocab];
    let mut ids = vec![u32::MAX - 1; n];
    let mut logprobs = vec![f32::INFINITY; n];
    let mut top = vec![u32::MAX - 1; (n * max_top * 2).max(1)];
    match target {
        Target::Host => {
            let launch = device::launch(n, vocab, max_top);
            let buf = |b| match b {
                device::Buf::Logits => input.as_mut_ptr().cast(),
                device::Buf::Work => work.as_mut_ptr().cast(),
                device::Buf::Params => params.as_mut_ptr().cast(),
                device::Buf::Ids => ids.as_mut_ptr().cast(),
                device::Buf::Logprobs => logprobs.as_mut_ptr().cast(),
                device::Buf::Top => top.as_mut_ptr().cast::<c_void>(),
            };
            run_on_host(&launch, seed, buf, &format!("{n} rows of {vocab}"));
        }
        #[cfg(feature = "cuda")]
        Target::Gpu(dev) => {
            let t = Tensor::from_slice(&input, (n, vocab), dev).unwrap();
            let out = wick::sampling::device::cuda::sample_rows(&t, rows).unwrap();
            return out
                .into_iter()
                .map(|s| Drawn {
                    id: s.id,
                    logprob: s.logprob,
                    top: s.top_logprobs,
                })
                .collect();
        }
    }
    (0..n)
        .map(|r| Drawn {
            id: ids[r],
            logprob: rows[r].logprobs.map(|_| logprobs[r]),
            top: (0..rows[r].logprobs.unwrap_or(0))
                .map(|k| top[(r * max_top + k) * 2..][..2].to_vec())
                .filter(|p| p[0] != u32::MAX)
                .map(|p| (p[0], f32::from_bits(p[1])))
                .collect(),
        })
        .collect()
}

/// 64 seeded requests, each drawing three tokens from its row of logits
/// by the host's `Sampler::sample` and by the device sampler with the keys
/// its twin sampler draws: the same token in every draw, and logprobs
/// within 1e-3. The requests mix greedy and sampled, top-k (1, a few, more
/// than the vocabulary), top-p, min-p, the three penalties (on rows whose
/// prompt holds their likeliest ids, some rows all negative),
/// `logit_bias` (a forced and a banned token), `min_tokens` banning the
/// likeliest ids, grammar masks, top logprobs, and logits rounded to
/// tenths so that ties sit at the top-k and top-p boundaries.
fn sampling_cases(target: &Target) {
    let seed = fresh_seed();
    let mut rng = Lcg(seed);
    let vocab = 3001;
    let mut logits = Vec::new();
    let mut rows = Vec::new();
    let mut want = Vec::new();
    for r in 0..64usize {
        let shift = if r % 8 == 3 { -8.0 } else { 0.0 };
        let mut row: Vec<f32> = (0..vocab).map(|_| rng.next() * 6.0 + shift).collect();
        if r % 5 < 2 {
            for v in &mut row {
                *v = (*v * 10.0).round() / 10.0;
            }
        }
        let pick = |rng: &mut Lcg| ((rng.next() + 1.0) * 0.5 * vocab as f32) as u32 % vocab as u32;
        let mut prompt: Vec<u32> = (0..40).map(|_| pick(&mut rng)).collect();
        if r % 2 == 1 {
            let mut order: Vec<u32> = (0..vocab as u32).collect();
            order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
            prompt.extend(&order[..6]);
        }
        let output: Vec<u32> = (0..12).map(|_| pick(&mut rng)).collect();
        let top = argmax(&row);
        let params = SamplingParams {
            temperature: [0.0, 0.7, 1.0, 1.6][r % 4],
            top_k: [0, 1, 7, 50, 300, vocab + 5][r / 4 % 6],
            top_p: [1.0, 0.9, 0.5][r % 3],
            min_p: [0.0, 0.0, 0.05][r / 3 % 3],
            repetition_penalty: [1.0, 1.3][r / 2 % 2],
            presence_penalty: [0.0, 0.5][r / 5 % 2],
            frequency_penalty: [0.0, 0.3][r / 7 % 2],
            logit_bias: match r % 5 {
                1 => vec![(pick(&mut rng), 100.0), (top, -100.0)].into(),
                3 => vec![(pick(&mut rng), 1.5)].into(),
                _ => vec![].into(),
            },
            logprobs: [None, Some(0), Some(3), None, Some(5)][r % 5],
            min_tokens: if r % 6 == 5 { 20 } else { 0 },
            stop_token_ids: vec![top, pick(&mut rng)].into(),
            seed: Some(seed ^ r as u64),
            ..Default::default()
        };
        let allowed = (r % 4 == 2).then(|| {
            let mut words = vec![0u32; vocab.div_ceil(32)];
            for id in 0..vocab {
                if rng.next() > -0.5 {
                    words[id / 32] |= 1 << (id % 32);
                }
            }
            words
        });
        let mut host = Sampler::new(&params);
        host.set_eos_ids(&[7]);
        let mut twin = Sampler::new(&params);
        twin.set_eos_ids(&[7]);
        let mut masked = row.clone();
        if let Some(words) = &allowed {
            for (id, l) in masked.iter_mut().enumerate() {
                if words[id / 32] >> (id % 32) & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        for _ in 0..3 {
            want.push(host.sample(&mut masked.clone(), &prompt, &output));
            rows.push(twin.device_row(&prompt, &output, allowed.clone()));
            logits.extend(&row);
        }
    }
    let got = device_sample(target, &logits, vocab, &rows, seed);
    for (r, (g, w)) in got.iter().zip(&want).enumerate() {
        let what = format!(
            "row {r} ({:?}), seed {seed}",
            DeviceRow {
                allowed: None,
                ..rows[r].clone()
            }
        );
        assert_eq!(g.id, w.id, "{what}");
        match (g.logprob, w.logprob) {
            (Some(a), Some(b)) => assert!((a - b).abs() < 1e-3, "{what}: logprob {a} vs {b}"),
            (a, b) => assert_eq!(a.is_some(), b.is_some(), "{what}"),
        }
        assert_eq!(g.top.len(), w.top_logprobs.len(), "{what}");
        for (a, b) in g.top.iter().zip(&w.top_logprobs) {
            assert!(
                a.0 == b.0 && (a.1 - b.1).abs() < 1e-3,
                "{what}: top {a:?} vs {b:?}"
            );
        }
    }
}

#[test]
fn device_sampling_on_the_host_build_matches_the_host_sampler() {
    sampling_cases(&Target::Host);
}

#[cfg(feature = "cuda")]
#[test]
fn device_sampling_on_the_gpu_matches_the_host_sampler() {
    let Some(dev) = gpu() else { return };
    sampling_cases(&Target::Gpu(dev));
}

/// The fused residual add and RMSNorm against the unfused ops on the CPU
/// (`elementwise::add_rms_norm`'s own fallback: `add`, then candle's
/// `rms_norm`): both outputs, every dtype, widths below a block, ragged and
/// model-sized.
fn add_rms_norm_cases(target: &Target) {
    let seed = fresh_seed();
    let mut rng = Lcg(seed);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for hidden in [64, 576, 2880, 4100] {
            let rows = 5;
            let x = (rng.tensor(rows, hidden) * 3.0)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let y = rng.tensor(rows, hidden).to_dtype(dtype).unwrap();
            let w = rng
                .tensor(1, hidden)
                .flatten_all()
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let eps = 1e-6;
            let (want_sum, want_out) =
                wick::models::elementwise::add_rms_norm(&x, &y, &w, eps).unwrap();
            let (sum, out) = match target {
                Target::Host => {
                    let (mut xb, mut yb, mut wb) = (
                        HostBuf::of(&x, dtype),
                        HostBuf::of(&y, dtype),
                        HostBuf::of(&w, dtype),
                    );
                    let mut sum = HostBuf::nan(dtype, rows * hidden);
                    let mut out = HostBuf::nan(dtype, rows * hidden);
                    let launch =
                        wick::models::elementwise::add_rms_norm_launch(rows, hidden, dtype, eps);
                    let buf = |b| match b {
                        NormBuf::X => xb.ptr(),
                        NormBuf::Y => yb.ptr(),
                        NormBuf::W => wb.ptr(),
                        NormBuf::Sum => sum.ptr(),
                        NormBuf::Out => out.ptr(),
                    };
                    run_on_host(&launch, seed, buf, &format!("{dtype:?} x {hidden}"));
                    let t = |b: &HostBuf| {
                        Tensor::from_vec(b.to_f32(), (rows, hidden), &Device::Cpu).unwrap()
                    };
                    (t(&sum), t(&out))
                }
                #[cfg(feature = "cuda")]
                Target::Gpu(dev) => {
                    let on = |t: &Tensor| t.to_device(dev).unwrap();
                    wick::models::elementwise::add_rms_norm(&on(&x), &on(&y), &on(&w), eps).unwrap()
                }
            };
            let f32_of = |t: &Tensor| {
                t.to_dtype(DType::F32)
                    .unwrap()
                    .to_device(&Device::Cpu)
                    .unwrap()
            };
            let tol = match dtype {
                DType::F32 => 1e-5,
                _ => 2e-2,
            };
            let what = format!("{dtype:?}, hidden {hidden}, seed {seed}");
            assert_eq!(max_diff(&sum, &f32_of(&want_sum)), 0.0, "{what}: the sums");
            let d = max_diff(&out, &f32_of(&want_out));
            assert!(d <= tol, "{what}: the norms {d} apart");
        }
    }
}

#[test]
fn add_rms_norm_on_the_host_build_matches_the_unfused_ops() {
    add_rms_norm_cases(&Target::Host);
}

#[cfg(feature = "cuda")]
#[test]
fn add_rms_norm_on_the_gpu_matches_the_unfused_ops() {
    let Some(dev) = gpu() else { return };
    add_rms_norm_cases(&Target::Gpu(dev));
}

/// A step of the gated-delta test: each sequence's (slot, first position,
/// rows).
type DeltaStep = Vec<(u32, usize, usize)>;

/// The gated delta rule (`gated_delta.cu`) against its CPU twin,
/// `GatedDelta::run` (checked against transformers by the Qwen3.5 model
/// tests), over three steps: two sequences start, one in a prompt of
/// several rows and one of a single row; both carry on while a third
/// starts in another slot; then decode rows. Shapes: the tiny fixture's
/// heads (grouped, four taps), Qwen3.5's 128 x 128 heads (tiled value
/// heads), and heads that split over several groups of rows, with three
/// taps and with one. The pool starts as NaN, so a fresh sequence that
/// read its slot, or an output left unwritten, shows.
fn gated_delta_cases(target: &Target) {
    use wick::models::gated_delta::{self, DeltaBuf, DeltaDims, GatedDelta};
    let seed = fresh_seed();
    let mut rng = Lcg(seed);
    let shapes = [
        (4, 2, 4, 16, 16, false),
        (4, 1, 2, 128, 128, true),
        (3, 2, 2, 64, 32, false),
        (1, 1, 3, 8, 64, true),
    ];
    let steps: Vec<DeltaStep> = vec![
        vec![(2, 0, 5), (0, 0, 1)],
        vec![(2, 5, 1), (0, 1, 3), (4, 0, 2)],
        vec![(0, 4, 1), (2, 6, 1), (4, 2, 1)],
    ];
    for (conv_kernel, k_heads, v_heads, k_dim, v_dim, v_heads_tiled) in shapes {
        let d = DeltaDims {
            conv_kernel,
            k_heads,
            v_heads,
            k_dim,
            v_dim,
            v_heads_tiled,
            eps: 1e-6,
        };
        assert!(gated_delta::supports(&d), "{d:?}");
        let mut vals =
            |n: usize, scale: f32| (0..n).map(|_| rng.next() * scale).collect::<Vec<_>>();
        let conv = vals(d.conv_dim() * conv_kernel, 0.8);
        let neg_a: Vec<f32> = vals(v_heads, 1.0).into_iter().map(|x| -x.exp()).collect();
        let dt_bias = vals(v_heads, 1.0);
        let norm = vals(v_dim, 1.0);
        let delta_on = |dev: &Device| {
            let (c, a, b, n) = (conv.clone(), neg_a.clone(), dt_bias.clone(), norm.clone());
            GatedDelta::new(d, c, a, b, n, dev).unwrap()
        };
        let host_delta = delta_on(&Device::Cpu);
        // Two layers' states per slot; this one is the second.
        let (stride, at) = (2 * d.state_len() + 3, d.state_len() + 1);
        let slots = 5;
        let mut want_states = vec![vec![f32::NAN; d.state_len()]; slots];
        #[cfg(feature = "cuda")]
        let gpu = match target {
            Target::Gpu(dev) => Some((
                delta_on(dev),
                Tensor::full(f32::NAN, (slots, stride), dev).unwrap(),
            )),
            Target::Host => None,
        };
        let mut pool = vec![f32::NAN; slots * stride];
        for (i, step) in steps.iter().enumerate() {
            let what = format!("{d:?}, step {i}, seed {seed}");
            let t: usize = step.iter().map(|s| s.2).sum();
            let width = d.in_width();
            let rows = vals(t * width, 1.5);
            let mut seqs = Vec::new();
            let mut start = 0;
            for &(slot, first_pos, len) in step {
                seqs.push(wick::models::SeqSlice {
                    start,
                    len,
                    first_pos,
                    block_table: Vec::new(),
                    window_table: Vec::new(),
                    state_slot: Some(slot),
                    logits: LogitRows::None,
                    hidden: LogitRows::None,
                    seen_whole: Vec::new(),
                });
                start += len;
            }
            // The CPU twin, sequence by sequence.
            let vw = d.value_width();
            let mut want = vec![0f32; t * vw];
            for s in &seqs {
                let state = &mut want_states[s.state_slot.unwrap() as usize];
                if s.first_pos == 0 {
                    state.fill(0.0);
                }
                host_delta.run(
                    &rows[s.start * width..(s.start + s.len) * width],
                    state,
                    &mut want[s.start * vw..(s.start + s.len) * vw],
                );
            }
            let got = match target {
                Target::Host => {
                    let desc: Vec<u32> = seqs
                        .iter()
                        .flat_map(|s| {
                            [
                                s.start as u32,
                                s.len as u32,
                                s.state_slot.unwrap(),
                                u32::from(s.first_pos == 0),
                            ]
                        })
                        .collect();
                    let (mut rows_b, mut params, mut desc) =
                        (rows.clone(), host_delta.params(), desc);
                    let mut mixed = vec![f32::NAN; t * d.conv_dim()];
                    let mut out = vec![f32::NAN; t * vw];
                    let plan = gated_delta::launches(&d, seqs.len(), stride, at).unwrap();
                    for l in &plan {
                        let buf = |b| -> *mut c_void {
                            match b {
                                DeltaBuf::Rows => rows_b.as_mut_ptr().cast(),
                                DeltaBuf::Params => params.as_mut_ptr().cast(),
                                DeltaBuf::Seqs => desc.as_mut_ptr().cast(),
                                DeltaBuf::States => pool.as_mut_ptr().cast(),
                                DeltaBuf::Mixed => mixed.as_mut_ptr().cast(),
                                DeltaBuf::Out => out.as_mut_ptr().cast(),
                            }
                        };
                        run_on_host(l, seed, buf, &what);
                    }
                    out
                }
                #[cfg(feature = "cuda")]
                Target::Gpu(dev) => {
                    let (delta, gpu_pool) = gpu.as_ref().unwrap();
                    let ids: Vec<u32> = seqs.iter().map(|s| s.state_slot.unwrap()).collect();
                    let mut states =
                        gated_delta::StepStates::device(gpu_pool.clone(), &seqs, &ids).unwrap();
                    let proj = Tensor::from_vec(rows.clone(), (t, width), dev).unwrap();
                    let out = delta.forward(&proj, &seqs, &mut states, at).unwrap();
                    pool = gpu_pool.flatten_all().unwrap().to_vec1().unwrap();
                    out.flatten_all().unwrap().to_vec1().unwrap()
                }
            };
            let diff = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(
                    0f32,
                    |m, x| if x.is_nan() { f32::INFINITY } else { m.max(x) },
                );
            assert!(diff <= 2e-4, "{what}: outputs {diff} apart");
            for s in &seqs {
                let slot = s.state_slot.unwrap() as usize;
                let got = &pool[slot * stride + at..][..d.state_len()];
                let diff = got
                    .iter()
                    .zip(&want_states[slot])
                    .map(|(a, b)| (a - b).abs())
                    .fold(
                        0f32,
                        |m, x| if x.is_nan() { f32::INFINITY } else { m.max(x) },
                    );
                assert!(diff <= 2e-4, "{what}: slot {slot}'s state {diff} apart");
            }
            // The first layer's state and the slots' padding are untouched.
            for slot in 0..slots {
                let outside = pool[slot * stride..slot * stride + at]
                    .iter()
                    .chain(&pool[slot * stride + at + d.state_len()..(slot + 1) * stride]);
                assert!(
                    outside.clone().all(|x| x.is_nan()),
                    "{what}: slot {slot} written outside its layer"
                );
            }
        }
    }
}

#[test]
fn gated_delta_on_the_host_build_matches_the_cpu_recurrence() {
    gated_delta_cases(&Target::Host);
}

#[cfg(feature = "cuda")]
#[test]
fn gated_delta_on_the_gpu_matches_the_cpu_recurrence() {
    let Some(dev) = gpu() else { return };
    gated_delta_cases(&Target::Gpu(dev));
}

/// One MoE layer's case: the block types of gate, up and down, the
/// activation, whether the experts have biases (gpt-oss) and routing
/// scales (Gemma 4), whether the top k weights are renormalized.
struct MoeCase {
    types: [GgmlDType; 3],
    hidden: usize,
    ff: usize,
    experts: usize,
    top_k: usize,
    act: Act,
    bias: bool,
    scale: bool,
    renormalize: bool,
}

/// `moe.cu` (routing, grouped gate/up and down, the weighted sum) against
/// the block computed here from candle's dequantization of the same
/// weights, in f64: every block type it reads, each activation, biases,
/// scales, renormalized or not. Steps of one row (decode) and of 21 rows,
/// where every row's scores favour expert 0 (three tiles of it) and the
/// last expert is never chosen (no rows). Buffers start as NaN, so a slot
/// left out of the tiles, or an output left unwritten, shows. The load
/// counters must count each expert's rows.
fn moe_cases(target: &Target) {
    use candle_core::quantized::QTensor;
    use wick::models::moe_device::{self, MoeBuf, MoeShape};
    let seed = fresh_seed();
    let mut rng = Lcg(seed);
    use GgmlDType::*;
    let cases = [
        MoeCase {
            types: [Q8_0, Q8_0, Q8_0],
            hidden: 64,
            ff: 96,
            experts: 8,
            top_k: 2,
            act: Act::Silu,
            bias: false,
            scale: false,
            renormalize: true,
        },
        MoeCase {
            types: [Q4K, Q5K, Q6K],
            hidden: 256,
            ff: 256,
            experts: 4,
            top_k: 2,
            act: Act::Silu,
            bias: false,
            scale: false,
            renormalize: false,
        },
        MoeCase {
            types: [Q4_0, Q4_1, Q5_0],
            hidden: 64,
            ff: 64,
            experts: 6,
            top_k: 3,
            act: Act::GeluTanh,
            bias: false,
            scale: true,
            renormalize: true,
        },
        MoeCase {
            types: [Q5_1, BF16, F16],
            hidden: 96,
            ff: 32,
            experts: 5,
            top_k: 1,
            act: Act::SwigluOai,
            bias: true,
            scale: false,
            renormalize: true,
        },
        MoeCase {
            types: [F32, Q8_0, Q4K],
            hidden: 32,
            ff: 256,
            experts: 3,
            top_k: 2,
            act: Act::SwigluOai,
            bias: true,
            scale: false,
            renormalize: false,
        },
    ];
    for c in &cases {
        let e = c.experts;
        // Weights of a few tenths, so quantization keeps them distinct.
        let stacks: Vec<QTensor> = [(c.ff, c.hidden), (c.ff, c.hidden), (c.hidden, c.ff)]
            .iter()
            .zip(c.types)
            .map(|(&(n, k), t)| {
                let w = (rng.tensor(e * n, k) * 0.3)
                    .unwrap()
                    .reshape((e, n, k))
                    .unwrap();
                QTensor::quantize(&w, t).unwrap()
            })
            .collect();
        let dense: Vec<Vec<f32>> = stacks
            .iter()
            .map(|q| {
                let t = q.dequantize(&Device::Cpu).unwrap();
                t.flatten_all().unwrap().to_vec1().unwrap()
            })
            .collect();
        let mut vals = |n: usize, s: f32| (0..n).map(|_| rng.next() * s).collect::<Vec<f32>>();
        let gate_up_bias = vals(e * 2 * c.ff, 0.5);
        let down_bias = vals(e * c.hidden, 0.5);
        let scale = vals(e, 1.0);
        for rows in [1, 21] {
            let what = format!("{:?}, {rows} rows, seed {seed}", c.types);
            let x = vals(rows * c.hidden, 1.0);
            let mut scores = vals(rows * e, 2.0);
            if rows > 1 {
                for r in 0..rows {
                    scores[r * e] += 6.0;
                    scores[r * e + e - 1] = -30.0;
                }
            }
            // The block in f64: softmax, top k by score (ties to the lower
            // expert), each chosen expert's MLP, the weighted sum.
            let act = |g: f64, u: f64| -> f64 {
                match c.act {
                    Act::Silu => g / (1.0 + (-g).exp()) * u,
                    Act::GeluTanh => {
                        let t = (0.797_884_560_8 * (g + 0.044715 * g * g * g)).tanh();
                        0.5 * g * (1.0 + t) * u
                    }
                    Act::SwigluOai => {
                        let (g, u) = (g.min(7.0), u.clamp(-7.0, 7.0));
                        g / (1.0 + (-1.702 * g).exp()) * (u + 1.0)
                    }
                }
            };
            let mut want = vec![0f64; rows * c.hidden];
            let mut routed = vec![0u64; e];
            for r in 0..rows {
                let s = &scores[r * e..][..e];
                let max = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
                let p: Vec<f64> = s.iter().map(|&v| (v as f64 - max).exp()).collect();
                let mut order: Vec<usize> = (0..e).collect();
                order.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
                let top = &order[..c.top_k];
                let norm: f64 = match c.renormalize {
                    true => top.iter().map(|&i| p[i]).sum(),
                    false => p.iter().sum(),
                };
                let xr = &x[r * c.hidden..][..c.hidden];
                for &ex in top {
                    routed[ex] += 1;
                    let mut w = p[ex] / norm;
                    if c.scale {
                        w *= scale[ex] as f64;
                    }
                    let dot = |m: &[f32], row: usize, k: usize, v: &[f64]| -> f64 {
                        m[row * k..][..k]
                            .iter()
                            .zip(v)
                            .map(|(&a, &b)| a as f64 * b)
                            .sum()
                    };
                    let xv: Vec<f64> = xr.iter().map(|&v| v as f64).collect();
                    let h: Vec<f64> = (0..c.ff)
                        .map(|j| {
                            let (mut g, mut u) = (
                                dot(&dense[0], ex * c.ff + j, c.hidden, &xv),
                                dot(&dense[1], ex * c.ff + j, c.hidden, &xv),
                            );
                            if c.bias {
                                g += gate_up_bias[ex * 2 * c.ff + j] as f64;
                                u += gate_up_bias[ex * 2 * c.ff + c.ff + j] as f64;
                            }
                            act(g, u)
                        })
                        .collect();
                    for i in 0..c.hidden {
                        let mut y = dot(&dense[2], ex * c.hidden + i, c.ff, &h);
                        if c.bias {
                            y += down_bias[ex * c.hidden + i] as f64;
                        }
                        want[r * c.hidden + i] += w * y;
                    }
                }
            }
            if rows > 1 {
                assert_eq!(routed[0], rows as u64, "{what}: expert 0 takes every row");
                assert_eq!(routed[e - 1], 0, "{what}: the last expert takes none");
            }
            let shape = MoeShape {
                rows,
                experts: e,
                top_k: c.top_k,
                hidden: c.hidden,
                ff: c.ff,
                renormalize: c.renormalize,
                act: c.act,
                has_bias: c.bias,
                has_scale: c.scale,
                types: c.types,
            };
            let (got, load) = match target {
                Target::Host => {
                    let plan = moe_device::launches(&shape).expect("a shape moe.cu takes");
                    let bytes = |i: usize| stacks[i].data().unwrap().to_vec();
                    let (mut g, mut u, mut d) = (bytes(0), bytes(1), bytes(2));
                    let (mut x, mut scores, mut scale, mut gub, mut db) = (
                        x.clone(),
                        scores.clone(),
                        scale.clone(),
                        gate_up_bias.clone(),
                        down_bias.clone(),
                    );
                    let slots = shape.slots();
                    let mut plan_b = vec![u32::MAX; shape.plan_len()];
                    let mut weights = vec![f32::NAN; slots];
                    let mut load = vec![0u64; e];
                    let mut hidden = vec![f32::NAN; slots * c.ff];
                    let mut expert = vec![f32::NAN; slots * c.hidden];
                    let mut out = vec![f32::NAN; rows * c.hidden];
                    for l in &plan {
                        let buf = |b| -> *mut c_void {
                            match b {
                                MoeBuf::Scores => scores.as_mut_ptr().cast(),
                                MoeBuf::Scale => scale.as_mut_ptr().cast(),
                                MoeBuf::Plan => plan_b.as_mut_ptr().cast(),
                                MoeBuf::Weights => weights.as_mut_ptr().cast(),
                                MoeBuf::Load => load.as_mut_ptr().cast(),
                                MoeBuf::X => x.as_mut_ptr().cast(),
                                MoeBuf::Gate => g.as_mut_ptr().cast(),
                                MoeBuf::Up => u.as_mut_ptr().cast(),
                                MoeBuf::Down => d.as_mut_ptr().cast(),
                                MoeBuf::GateUpBias => gub.as_mut_ptr().cast(),
                                MoeBuf::DownBias => db.as_mut_ptr().cast(),
                                MoeBuf::Hidden => hidden.as_mut_ptr().cast(),
                                MoeBuf::Expert => expert.as_mut_ptr().cast(),
                                MoeBuf::Out => out.as_mut_ptr().cast(),
                            }
                        };
                        run_on_host(l, seed, buf, &what);
                    }
                    (out, load)
                }
                #[cfg(feature = "cuda")]
                Target::Gpu(dev) => {
                    use wick::models::moe_device::{DeviceExperts, ExpertStack, Extras, MoeStep};
                    let on = |q: &QTensor| ExpertStack::from_qtensor(q, dev).unwrap().unwrap();
                    let experts =
                        DeviceExperts::new([on(&stacks[0]), on(&stacks[1]), on(&stacks[2])])
                            .unwrap();
                    let load = Tensor::zeros(e, DType::I64, dev).unwrap();
                    let vec_on = |v: &[f32]| Tensor::new(v, dev).unwrap();
                    let extras = Extras {
                        bias: c.bias.then(|| (vec_on(&gate_up_bias), vec_on(&down_bias))),
                        scale: c.scale.then(|| vec_on(&scale)),
                        load: load.clone(),
                    };
                    let step = MoeStep {
                        top_k: c.top_k,
                        renormalize: c.renormalize,
                        act: c.act,
                    };
                    let xs = Tensor::from_vec(x.clone(), (rows, c.hidden), dev).unwrap();
                    let sc = Tensor::from_vec(scores.clone(), (rows, e), dev).unwrap();
                    let out = experts.forward(&sc, &xs, &step, || Ok(extras)).unwrap();
                    let out = out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    let load = load.to_vec1::<i64>().unwrap();
                    (out, load.into_iter().map(|n| n as u64).collect())
                }
            };
            let peak = want.iter().fold(1f64, |m, v| m.max(v.abs()));
            let diff = got
                .iter()
                .zip(&want)
                .map(|(&a, &b)| (a as f64 - b).abs())
                .fold(
                    0f64,
                    |m, x| if x.is_nan() { f64::INFINITY } else { m.max(x) },
                );
            assert!(
                diff <= 1e-4 * peak,
                "{what}: outputs {diff} apart (peak {peak})"
            );
            assert_eq!(load, routed, "{what}: rows counted per expert");
        }
    }
}

#[test]
fn moe_on_the_host_build_matches_the_dequantized_block() {
    moe_cases(&Target::Host);
}

#[cfg(feature = "cuda")]
#[test]
fn moe_on_the_gpu_matches_the_dequantized_block() {
    let Some(dev) = gpu() else { return };
    moe_cases(&Target::Gpu(dev));
}

/// Runs one of the emulator's self-test kernels (`selftest.cu`) over one
/// block of `threads`.
fn selftest(name: &str, threads: u32, seed: u64, args: &[Value]) -> Result<(), String> {
    // SAFETY: each caller passes the kernel's parameters in order, its
    // buffers at least `threads` long.
    unsafe { wick_cuda_host::launch(name, [1, 1, 1], [threads, 1, 1], seed, args) }
}

/// The emulator's point: a kernel missing a barrier fails under it. Each
/// thread writes its value to shared memory and reads its neighbour's;
/// without the barrier, some thread runs before its neighbour has written
/// in any order the emulator picks, and reads the poison.
#[test]
fn a_missing_syncthreads_fails_under_the_emulator() {
    for threads in [32u32, 64, 128, 1024] {
        for seed in 0..8 {
            let mut input: Vec<f32> = (0..threads).map(|t| t as f32).collect();
            let want: Vec<f32> = (0..threads).map(|t| ((t + 1) % threads) as f32).collect();
            for sync in [1, 0] {
                let mut out = vec![f32::NAN; threads as usize];
                let args = [
                    Value::Ptr(input.as_mut_ptr().cast()),
                    Value::Ptr(out.as_mut_ptr().cast()),
                    Value::I32(sync),
                ];
                selftest("selftest_neighbour", threads, seed, &args).unwrap();
                match sync {
                    1 => assert_eq!(out, want, "{threads} threads, seed {seed}"),
                    _ => assert!(
                        out.iter().any(|x| x.is_nan()),
                        "{threads} threads, seed {seed}: no barrier, yet every read saw its write"
                    ),
                }
            }
        }
    }
}

/// A warp reduction after half the warp returned, and a barrier half the
/// block skips: each fails the launch, naming kernel, block and seed.
#[test]
fn a_shuffle_or_barrier_some_threads_never_reach_fails_the_launch() {
    let mut out = vec![0f32; 64];
    let e = selftest(
        "selftest_early_return",
        32,
        7,
        &[Value::Ptr(out.as_mut_ptr().cast()), Value::I32(16)],
    )
    .unwrap_err();
    assert!(
        e.contains("selftest_early_return") && e.contains("seed 7") && e.contains("has ended"),
        "{e}"
    );
    // All 32 lanes there: the sum of 0..32.
    selftest(
        "selftest_early_return",
        32,
        7,
        &[Value::Ptr(out.as_mut_ptr().cast()), Value::I32(32)],
    )
    .unwrap();
    assert!(out[..32].iter().all(|&x| x == 496.0), "{out:?}");

    let e = selftest(
        "selftest_divergent_barrier",
        64,
        3,
        &[Value::Ptr(out.as_mut_ptr().cast()), Value::I32(16)],
    )
    .unwrap_err();
    assert!(
        e.contains("no thread can go on") && e.contains("__syncthreads"),
        "{e}"
    );
    // A full mask in a warp of 16 lanes (a block of 48 threads).
    let mut ints = vec![0i32; 48];
    let mut outs = vec![0i32; 48];
    let e = selftest(
        "selftest_warp",
        48,
        1,
        &[
            Value::Ptr(ints.as_mut_ptr().cast()),
            Value::Ptr(outs.as_mut_ptr().cast()),
            Value::U32(u32::MAX),
            Value::I32(3),
            Value::I32(1),
            Value::I32(32),
        ],
    )
    .unwrap_err();
    assert!(e.contains("its warp has 16 lanes"), "{e}");
    assert!(selftest("no_such_kernel", 32, 0, &[]).is_err());
}

/// The warp shuffles and the ballot against CUDA's rules, written out here:
/// `width` splits the warp into segments; `idx` reads lane `arg % width`
/// of the segment; `up` / `down` read `arg` lanes before / after within the
/// segment, else keep their own value; `xor` reads `lane ^ arg`, keeping
/// its own value where that lies in a later segment. A lane the mask leaves
/// out neither calls nor is read (reading it is undefined: the poison).
#[test]
fn warp_shuffles_follow_cuda() {
    const POISON: i32 = -1;
    let input: Vec<i32> = (0..32).map(|l| 100 + l).collect();
    for mask in [u32::MAX, 0x0000_ffff, 0xf0f0_f0f0] {
        for (op, arg, width) in [
            (0, 5, 32),
            (0, 37, 32),
            (0, 3, 8),
            (1, 1, 32),
            (1, 3, 8),
            (2, 1, 32),
            (2, 2, 4),
            (3, 1, 32),
            (3, 16, 32),
            (3, 4, 8),
            (3, 8, 4),
            (4, 0, 32),
        ] {
            let mut ins: Vec<i32> = match op {
                4 => (0..32).map(|l| l % 3).collect(),
                _ => input.clone(),
            };
            let mut out = vec![i32::MIN; 32];
            let args = [
                Value::Ptr(ins.as_mut_ptr().cast()),
                Value::Ptr(out.as_mut_ptr().cast()),
                Value::U32(mask),
                Value::I32(op),
                Value::I32(arg),
                Value::I32(width),
            ];
            selftest("selftest_warp", 32, 11, &args).unwrap();
            for (lane, &got) in out.iter().enumerate() {
                if mask >> lane & 1 == 0 {
                    assert_eq!(got, i32::MIN, "lane {lane} is not in mask {mask:#x}");
                    continue;
                }
                let w = width as usize;
                let (first, a) = (lane / w * w, arg as usize);
                let src = match op {
                    0 => first + a % w,
                    1 if lane - first >= a => lane - a,
                    2 if lane + a < first + w => lane + a,
                    3 if (lane ^ a) < first + w => lane ^ a,
                    _ => lane,
                };
                let want = match op {
                    4 => (0..32)
                        .filter(|&l| mask >> l & 1 == 1 && ins[l] != 0)
                        .fold(0u32, |b, l| b | 1 << l) as i32,
                    _ if mask >> src & 1 == 0 => POISON,
                    _ => input[src],
                };
                assert_eq!(
                    got, want,
                    "op {op} arg {arg} width {width} mask {mask:#x}, lane {lane}"
                );
            }
        }
    }
}

#[cfg(feature = "cuda")]
#[test]
fn models_on_the_gpu_match_transformers() {
    let Some(dev) = gpu() else { return };
    // Qwen3.5's linear layers run `gated_delta.cu` over the device pool;
    // the MoE families' experts run in `moe.cu` (dense checkpoints, stacked
    // in their dtype), gpt-oss's with biases and the clamped SwiGLU.
    for name in [
        "qwen3-tiny",
        "gemma3-tiny",
        "qwen35-tiny",
        "qwen35moe-tiny",
        "qwen3moe-tiny",
        "qwen2moe-tiny",
        "mixtral-tiny",
        "olmoe-tiny",
        "gpt-oss-tiny",
    ] {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let r = common::transformers_ref::read_reference(&dir.join("reference.json"));
        let options = wick::load::loader::LoadOptions {
            context: r.serve_context,
            ..Default::default()
        };
        let loaded = wick::load::loader::load(&dir, &options, &dev).unwrap();
        assert!(
            wick::attention::has_kernel(
                &KvLayout {
                    num_layers: 1,
                    num_kv_heads: loaded.model.info().num_kv_heads,
                    head_dim: loaded.model.info().head_dim,
                    block_size: 16,
                    num_blocks: 1,
                    dtype: KvDtype::F32,
                    window_kv: None,
                },
                &dev
            ),
            "{name}: the kernel does not serve this head size"
        );
        let diff = common::transformers_ref::worst_logit_diff(&r, &loaded, None);
        assert!(diff < 1e-3, "{name}: logits {diff} from transformers'");
    }
}
