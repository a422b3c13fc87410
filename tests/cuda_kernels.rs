//! wick's CUDA kernels against the CPU path, on a GPU. Built with
//! `--features cuda` (CI builds it where no GPU exists); each test skips,
//! saying so, where no CUDA device opens.
//!
//! - Paged attention and the cache write, against the host kernel on the
//!   same steps: fresh random inputs every run (the seed is printed), pools
//!   and outputs poisoned with NaN first, ragged batches mixing prompt
//!   chunks and decode rows, a prefix hit, a context long enough to split
//!   rows across blocks, sliding windows, more query heads per KV head
//!   than one block takes, and attention sinks (gpt-oss's), with rows
//!   split and not.
//! - The greedy pick: each row's argmax against the host's, with ties,
//!   NaN and -inf planted, vocabularies from below a warp to 262k.
//! - Whole models: logits against transformers' from the tiny fixtures.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use wick::attention::{cuda, paged_attention, step_meta, AttnDims};
use wick::kv::cache::{KvCache, KvDtype, KvLayout, LayerCache};
use wick::kv::step_meta::MetaBuffers;
use wick::load::loader::{load, LoadOptions};
use wick::models::{FlatBatch, LogitRows};
use wick::sampling::argmax::argmax;
use wick::sampling::argmax::argmax_rows;

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
    /// Activations and the GPU pool's dtype.
    act: DType,
    pool: DType,
    tol: f32,
    /// A random sink logit per query head.
    sinks: bool,
}

/// Four steps: two prompts in chunks, one of 1,500 tokens; a third
/// sequence whose first block is the first's (a prefix hit); then decode
/// rows, the last steps few enough that rows are split across blocks.
fn schedule(block_size: usize) -> Vec<Seq> {
    let blocks =
        |from: u32, n: usize| -> Vec<u32> { (0..n as u32).map(|i| from + 3 * i).collect() };
    let long = blocks(1, 1504usize.div_ceil(block_size));
    let short = blocks(0, 2 + 48usize.div_ceil(block_size));
    let mut hit = vec![short[0]];
    hit.extend(blocks(2, 40usize.div_ceil(block_size)));
    vec![
        Seq {
            table: short,
            steps: vec![0..20, 20..37, 37..38, 38..39, 39..40],
        },
        Seq {
            table: long,
            steps: vec![0..512, 512..1024, 1024..1500, 1500..1501, 1501..1502],
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

fn run_case(dev: &Device, case: Case, seed: u64) {
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
    // The host pool holds exactly what the GPU pool does: f16 for f16, and
    // f32 for values that are exact there (f32, or bf16 activations into a
    // bf16 pool).
    let host_dtype = match case.pool {
        DType::F16 => KvDtype::F16,
        _ => KvDtype::F32,
    };
    let mut host = KvCache::new(layout(host_dtype), &Device::Cpu, false).unwrap();
    let mut gpu = KvCache::new(layout(KvDtype::F32), dev, false).unwrap();
    let rows = 3 * 96 * block_size;
    let nan = |cols| {
        Tensor::full(f32::NAN, (rows, cols), dev)
            .unwrap()
            .to_dtype(case.pool)
            .unwrap()
    };
    let kv_dim = case.num_kv_heads * case.head_dim;
    *gpu.layer_mut(0) = LayerCache::Tensor {
        k: nan(kv_dim),
        v: nan(kv_dim),
    };

    let mut rng = Lcg(seed);
    // Sinks in [-4, 4): some above every score, some below.
    let sinks = case.sinks.then(|| {
        let s = rng.tensor(1, case.num_heads).flatten_all().unwrap();
        (s * 4.0).unwrap()
    });
    let seqs = schedule(block_size);
    let longest = seqs
        .iter()
        .map(|s| s.steps.last().unwrap().end)
        .max()
        .unwrap();
    for step in 0..seqs[0].steps.len() {
        let mut batch = FlatBatch::default();
        for s in seqs.iter().filter(|s| !s.steps[step].is_empty()) {
            let tokens = vec![0; longest];
            batch.push(
                &tokens,
                s.steps[step].clone(),
                s.table.clone(),
                LogitRows::Last,
            );
        }
        let t = batch.tokens.len();
        // Activations as the GPU sees them, in f32 for the host.
        let qkv = rng
            .tensor(t, dims.qkv_width())
            .to_dtype(case.act)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let (mut host_bufs, mut gpu_bufs) = (MetaBuffers::default(), MetaBuffers::default());
        let host_meta = step_meta(&mut host_bufs, &batch, &host, None, &Device::Cpu).unwrap();
        let want = paged_attention(&qkv, host.layer_mut(0), &host_meta, dims, sinks.as_ref());
        let want = want.unwrap();

        let gpu_meta = step_meta(&mut gpu_bufs, &batch, &gpu, None, dev).unwrap();
        assert!(
            gpu_meta.kernel().is_some(),
            "{case:?}: not packed for the kernel"
        );
        let out = Tensor::full(f32::NAN, (t, dims.num_heads * dims.head_dim), dev)
            .unwrap()
            .to_dtype(case.act)
            .unwrap();
        let LayerCache::Tensor { k, v } = gpu.layer_mut(0) else {
            unreachable!()
        };
        let q = qkv.to_dtype(case.act).unwrap().to_device(dev).unwrap();
        let gpu_sinks = sinks.as_ref().map(|s| s.to_device(dev).unwrap());
        cuda::write_and_attend_into(&q, k, v, &gpu_meta, dims, gpu_sinks.as_ref(), &out).unwrap();
        let diff = max_diff(&out, &want);
        assert!(
            diff <= case.tol,
            "{case:?} seed {seed} step {step}: max diff {diff} from the host kernel"
        );
    }
}

#[test]
fn paged_attention_matches_the_host_kernel() {
    let Some(dev) = gpu() else { return };
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
    for window in [5, 40, 700] {
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
    for (i, case) in cases.into_iter().enumerate() {
        run_case(&dev, case, seed.wrapping_add(i as u64));
    }
}

/// Whole models with head sizes the kernel serves (Qwen3's q/k norms,
/// Gemma 3's sliding windows and soft cap) against transformers' logits,
/// in f32.
/// Fresh random rows every run (the seed is printed); in each row in turn a
/// tie for the largest value planted around it, NaN planted (at id 0 too),
/// every value -inf, every value NaN. f32 and bf16 logits, the latter
/// against the host's pick of the same bf16 values. Runs of the same size
/// follow one another, so a row the kernel left unwritten would show a
/// stale id.
#[test]
fn argmax_matches_the_host() {
    let Some(dev) = gpu() else { return };
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
            let on_host = cpu.to_dtype(dtype).unwrap();
            let want: Vec<u32> = on_host
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap()
                .iter()
                .map(|r| argmax(r))
                .collect();
            let got = argmax_rows(&on_host.to_device(&dev).unwrap()).unwrap();
            assert_eq!(got, want, "{rows} rows of {vocab}, {dtype:?}, seed {seed}");
        }
    }
}

#[test]
fn models_on_the_gpu_match_transformers() {
    let Some(dev) = gpu() else { return };
    for name in ["qwen3-tiny", "gemma3-tiny"] {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let r = common::transformers_ref::read_reference(&dir.join("reference.json"));
        let options = LoadOptions {
            context: r.serve_context,
            ..Default::default()
        };
        let loaded = load(&dir, &options, &dev).unwrap();
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
