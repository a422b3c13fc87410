//! Compiles wick's CUDA kernels for the host, with `include/`'s headers in
//! place of CUDA's, and the emulator that runs them.

fn main() {
    let kernels = [
        "../../src/attention/paged_attention.cu",
        "../../src/sampling/argmax.cu",
        "src/selftest.cu",
    ];
    for path in
        kernels
            .iter()
            .chain(&["src/emulator.cpp", "src/kernels.cpp", "include/wick_cuda.h"])
    {
        println!("cargo:rerun-if-changed={path}");
    }
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .include("include")
        .file("src/emulator.cpp")
        .file("src/kernels.cpp")
        // `#pragma unroll` is nvcc's; the host compiler unrolls as it sees fit.
        .flag("-Wno-unknown-pragmas")
        .compile("wick_cuda_host");
}
