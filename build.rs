//! With the `cuda` feature, compiles wick's CUDA kernels (`src/**/*.cu`) to
//! PTX with nvcc, as candle-kernels does, for `include_str!` from
//! `$OUT_DIR`. The driver JIT-compiles PTX for the GPU it finds, so one
//! build serves every GPU at or above `CUDA_COMPUTE_CAP` (candle's variable;
//! default: the local GPU's, else 8.0), provided the driver is at least as
//! new as the nvcc that wrote it.

use std::path::PathBuf;
use std::process::Command;

const KERNELS: &[&str] = &[
    "src/attention/paged_attention.cu",
    "src/sampling/argmax.cu",
    "src/sampling/sampler.cu",
    "src/models/add_rms_norm.cu",
    "src/models/gated_delta.cu",
    "src/models/moe.cu",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=CUDA_ROOT");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = std::env::var_os("CUDA_ROOT")
        .map(|root| PathBuf::from(root).join("bin/nvcc"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "nvcc".into());
    let cap = compute_cap();
    for src in KERNELS {
        println!("cargo:rerun-if-changed={src}");
        let name = std::path::Path::new(src).file_stem().expect("a file name");
        let ptx = out.join(name).with_extension("ptx");
        let status = Command::new(&nvcc)
            .args(["--ptx", "-O3", "-std=c++17", "--use_fast_math"])
            .arg(format!("-arch=compute_{cap}"))
            .arg("-o")
            .arg(&ptx)
            .arg(src)
            .status()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", nvcc.display()));
        assert!(status.success(), "nvcc failed on {src}");
    }
}

fn compute_cap() -> String {
    if let Ok(cap) = std::env::var("CUDA_COMPUTE_CAP") {
        return cap.replace('.', "");
    }
    Command::new("nvidia-smi")
        .args(["--query-gpu=compute_cap", "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(|l| l.trim().replace('.', "")))
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "80".into())
}
