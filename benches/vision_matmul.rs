//! One SigLIP-so400m layer's linear layers at 896 x 896 (4096 patches,
//! width 1152, MLP 4304), as Gemma 3's image tower runs them 27 times per
//! image: bf16 products on AMX tiles (`quant::bf16`, where the CPU has
//! them) against candle's f32 matmul. `cargo bench --bench vision_matmul`.
//! Best of three runs each, in GFLOP/s (2 x rows x inputs x outputs).

use std::time::Instant;

use candle_core::{Device, Module, Tensor};
use wick::quant::bf16::Bf16Matrix;

const PATCHES: usize = 4096;
const RUNS: usize = 3;

fn main() -> candle_core::Result<()> {
    println!(
        "{:<22} {:>10} {:>10} {:>10}",
        "layer", "weights", "seconds", "GFLOP/s"
    );
    for (name, k, n) in [
        ("q, k, v or out", 1152, 1152),
        ("fc1", 1152, 4304),
        ("fc2", 4304, 1152),
    ] {
        let x = Tensor::randn(0f32, 1.0, (PATCHES, k), &Device::Cpu)?;
        let w = Tensor::randn(0f32, 0.05, (n, k), &Device::Cpu)?;
        let flop = 2.0 * (PATCHES * k * n) as f64;
        let best = |f: &dyn Fn() -> candle_core::Result<()>| -> candle_core::Result<f64> {
            let mut best = f64::INFINITY;
            for _ in 0..RUNS {
                let start = Instant::now();
                f()?;
                best = best.min(start.elapsed().as_secs_f64());
            }
            Ok(best)
        };
        let linear = candle_nn::Linear::new(w.clone(), None);
        let candle = best(&|| linear.forward(&x).map(|y| drop(std::hint::black_box(y))))?;
        let mut rows = vec![("candle f32", candle)];
        let xs = x.flatten_all()?.to_vec1::<f32>()?;
        if let Some(m) = Bf16Matrix::new(&w.flatten_all()?.to_vec1::<f32>()?, n, k) {
            let tiles = best(&|| {
                std::hint::black_box(m.matmul(&xs, PATCHES));
                Ok(())
            })?;
            rows.push(("wick bf16 tiles", tiles));
        }
        for (weights, secs) in rows {
            println!(
                "{name:<22} {weights:>10} {secs:>10.3} {:>10.1}",
                flop / secs / 1e9
            );
        }
    }
    Ok(())
}
