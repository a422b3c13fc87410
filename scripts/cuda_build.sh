#!/usr/bin/env bash
# Builds wick with `--features cuda` on a machine with no GPU and no CUDA
# install, then checks the binary where no GPU exists: `--device cpu` must
# work as in a CPU build and `--device cuda` must fail with one clear line.
#
# The toolkit comes from PyPI's CUDA 13.4 wheels (nvcc, headers, cuBLAS,
# cuRAND, NVRTC), installed once into $WICK_CUDA_CACHE (default
# ~/.cache/wick/cuda); the build's target dir lives there too, so reruns are
# incremental. No wheel ships the driver (libcuda), which candle links
# against, so a stub is generated from the driver symbols the build uses:
# each returns CUDA_ERROR_NO_DEVICE, as the real driver does on a machine
# without a GPU.
#
#   scripts/cuda_build.sh            # toolkit, build, checks
#   CUDA_COMPUTE_CAP=90 scripts/cuda_build.sh
#
# For a real GPU (scripts/gpu_build.sh does this): WICK_CUDA_VERSION=13.0
# picks the 13.0 wheels, since PTX from a newer nvcc does not JIT on an
# older driver (13.0 is driver 580's); RUSTFLAGS, if set, replaces
# .cargo/config.toml's target-cpu=native (the GPU host's CPU is another);
# WICK_CUDA_BUILD_ARGS replaces `--all-targets` in the last build; and any
# arguments are run as a command in the build's environment at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

version=${WICK_CUDA_VERSION:-13.4}
case $version in
# cudarc 0.19 accepts CUDA up to 13.4, and the CUDA 12 nvcc wheel has no nvcc.
13.4) cache=${WICK_CUDA_CACHE:-$HOME/.cache/wick/cuda}
      wheels="nvidia-cuda-nvcc==13.4.92 nvidia-nvvm==13.4.92 nvidia-cuda-crt==13.4.92
              nvidia-cuda-runtime==13.4.92 nvidia-cuda-nvrtc==13.4.92 nvidia-cublas==13.4.3.11
              nvidia-curand==10.4.4.72 nvidia-cuda-cccl==13.3.5.0.6" ;;
# A cache of its own: one target dir per toolkit, or each switch rebuilds all.
13.0) cache=${WICK_CUDA_CACHE:-$HOME/.cache/wick/cuda-13.0}
      wheels="nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
              nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvrtc==13.0.88 nvidia-cublas==13.0.2.14
              nvidia-curand==10.4.0.35 nvidia-cuda-cccl==13.0.85" ;;
*) echo "WICK_CUDA_VERSION: 13.4 or 13.0, not $version" >&2; exit 2 ;;
esac
root=$cache/py/nvidia/cu13
stub=$cache/stub
export CARGO_TARGET_DIR=$cache/target

if [ ! -x "$root/bin/nvcc" ]; then
    # shellcheck disable=SC2086 # $wheels is a list of words
    python3 -m pip install --quiet --disable-pip-version-check --target "$cache/py" $wheels
fi
# The wheels ship versioned libraries only; the linker looks for plain names.
for lib in "$root"/lib/lib*.so.*; do
    plain=${lib%%.so.*}.so
    [ -e "$plain" ] || ln -s "$(basename "$lib")" "$plain"
done

export PATH=$root/bin:$PATH
export CUDA_ROOT=$root CUDA_HOME=$root CUDA_PATH=$root
# No nvidia-smi here to ask; 80 is Ampere (A100), the oldest candle's
# kernels target in full.
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-80}
export LIBRARY_PATH=$root/lib:$stub${LIBRARY_PATH:+:$LIBRARY_PATH}

# Libraries first (no executable is linked yet), then the driver stub from
# the symbols they call, then everything.
cargo build --release --features cuda --lib
mkdir -p "$stub"
find "$CARGO_TARGET_DIR/release/deps" -name '*.rlib' -print0 |
    xargs -0 nm --undefined-only 2>/dev/null |
    awk '$1 == "U" && $2 ~ /^cu[A-Z]/ { print $2 }' | sort -u >"$stub/symbols.txt"
awk '{ printf "int %s(void) { return 100; /* CUDA_ERROR_NO_DEVICE */ }\n", $1 }' \
    "$stub/symbols.txt" >"$stub/cuda_stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub/libcuda.so.1" "$stub/cuda_stub.c"
ln -sf libcuda.so.1 "$stub/libcuda.so"
echo "libcuda stub: $(wc -l <"$stub/symbols.txt") driver symbols"
# shellcheck disable=SC2086 # a list of cargo arguments
cargo build --release --features cuda ${WICK_CUDA_BUILD_ARGS:---all-targets}

# The checks: the binary runs against the wheels' libraries and the stub.
wick=$CARGO_TARGET_DIR/release/wick
export LD_LIBRARY_PATH=$root/lib:$stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=$("$wick" generate --device cpu --max-tokens 8 --temperature 0 --prompt "The capital of France is")
[ -n "$out" ] || { echo "cuda build: --device cpu generated nothing" >&2; exit 1; }
echo "cuda build, --device cpu: $out"
# RUST_BACKTRACE (CI sets it) asks for a backtrace on purpose; the check is
# of what a user sees by default.
if err=$(env -u RUST_BACKTRACE -u RUST_LIB_BACKTRACE "$wick" generate --device cuda --max-tokens 8 --prompt "Hi" 2>&1); then
    echo "cuda build: --device cuda succeeded without a GPU" >&2
    exit 1
fi
lines=$(printf '%s\n' "$err" | wc -l)
if [ "$lines" -ne 1 ] || printf '%s' "$err" | grep -q -e panicked -e backtrace; then
    printf 'cuda build: --device cuda should fail in one line, got:\n%s\n' "$err" >&2
    exit 1
fi
echo "cuda build, --device cuda: $err"

# The caller's command (scripts/gpu_build.sh collects the bundle), in this
# environment: the same flags, so cargo reuses the build.
if [ $# -gt 0 ]; then
    exec "$@"
fi
