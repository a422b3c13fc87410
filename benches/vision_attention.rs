//! One SigLIP-so400m layer's attention at 896 x 896 (16 heads, 4096
//! patches, heads of 72), as Gemma 3's image tower runs it 27 times per
//! image: wick's host kernels (f32, and bf16 products on AMX tiles where
//! the CPU has them) against candle's ops (the whole score matrix,
//! softmax, and a second product). `cargo bench --bench
//! vision_attention`. Best of three runs each, in GFLOP/s of the two
//! products (4 x heads x patches² x head size).

use std::time::Instant;

use candle_core::{Device, Tensor};
use wick::attention::dense::dense_attention;
use wick::attention::dense_bf16::dense_attention_bf16;

const HEADS: usize = 16;
const PATCHES: usize = 4096;
const HEAD_DIM: usize = 72;
const RUNS: usize = 3;

fn main() -> candle_core::Result<()> {
    let shape = (HEADS, PATCHES, HEAD_DIM);
    let q = Tensor::randn(0f32, 1.0, shape, &Device::Cpu)?;
    let k = Tensor::randn(0f32, 1.0, shape, &Device::Cpu)?;
    let v = Tensor::randn(0f32, 1.0, shape, &Device::Cpu)?;
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    let flop = 4.0 * (HEADS * PATCHES * PATCHES * HEAD_DIM) as f64;
    let best = |f: &dyn Fn() -> candle_core::Result<Tensor>| -> candle_core::Result<f64> {
        let mut best = f64::INFINITY;
        for _ in 0..RUNS {
            let start = Instant::now();
            std::hint::black_box(f()?);
            best = best.min(start.elapsed().as_secs_f64());
        }
        Ok(best)
    };
    let wick = best(&|| dense_attention(&q, &k, &v, scale as f32))?;
    let tiles = dense_attention_bf16(&q, &k, &v, scale as f32)?
        .is_some()
        .then(|| best(&|| Ok(dense_attention_bf16(&q, &k, &v, scale as f32)?.unwrap())))
        .transpose()?;
    let candle = best(&|| {
        let scores = (q.matmul(&k.t()?)? * scale)?;
        candle_nn::ops::softmax_last_dim(&scores)?.matmul(&v)
    })?;
    println!("{:<28} {:>10} {:>10}", "attention", "seconds", "GFLOP/s");
    let mut rows = vec![("wick f32 (dense.rs)", wick), ("candle ops", candle)];
    if let Some(secs) = tiles {
        rows.insert(1, ("wick bf16 (dense_bf16.rs)", secs));
    }
    for (name, secs) in rows {
        println!("{name:<28} {secs:>10.3} {:>10.1}", flop / secs / 1e9);
    }
    Ok(())
}
