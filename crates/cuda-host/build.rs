//! Compiles wick's CUDA kernels for the host, with `include/`'s headers in
//! place of CUDA's, and the emulator that runs them. Each `.cu` file is its
//! own translation unit, so that files' macros and helpers never meet.

use std::fmt::Write;
use std::path::{Path, PathBuf};

const KERNELS: &[&str] = &[
    "../../src/attention/paged_attention.cu",
    "../../src/sampling/argmax.cu",
    "../../src/sampling/sampler.cu",
    "../../src/models/add_rms_norm.cu",
    "../../src/models/gated_delta.cu",
    "../../src/models/moe.cu",
    "src/selftest.cu",
];

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let here = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let mut build = cc::Build::new();
    let mut anchors = String::new();
    for path in KERNELS {
        println!("cargo:rerun-if-changed={path}");
        let name = Path::new(path)
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a name");
        let source = here.join(path).canonicalize().expect("the kernel file");
        let unit = out.join(format!("unit_{name}.cpp"));
        let text = format!(
            "#include \"wick_cuda.h\"\nnamespace {{\n#include \"{}\"\n}}\nvoid wick_cuda_unit_{name}() {{}}\n",
            source.display()
        );
        std::fs::write(&unit, text).expect("writing a unit");
        build.file(&unit);
        writeln!(anchors, "void wick_cuda_unit_{name}();").unwrap();
    }
    let calls: String = KERNELS
        .iter()
        .map(|p| Path::new(p).file_stem().and_then(|s| s.to_str()).unwrap())
        .map(|name| format!("    wick_cuda_unit_{name}();\n"))
        .collect();
    let units = out.join("units.cpp");
    std::fs::write(
        &units,
        format!("{anchors}void wick_cuda_link_units() {{\n{calls}}}\n"),
    )
    .expect("writing units.cpp");
    for path in [
        "src/emulator.cpp",
        "src/registry.cpp",
        "include/wick_cuda.h",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    build
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .include("include")
        .file("src/emulator.cpp")
        .file("src/registry.cpp")
        .file(&units)
        // `#pragma unroll` is nvcc's; the host compiler unrolls as it sees fit.
        .flag("-Wno-unknown-pragmas")
        .compile("wick_cuda_host");
}
