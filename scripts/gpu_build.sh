#!/usr/bin/env bash
# Builds the bundle a GPU session carries (docs/gpu.md): target/gpu/ with
# the stripped `wick` binary and CUDA test binaries, built for the GPU host
# (CUDA 13.0 wheels, since driver 580 cannot JIT a newer nvcc's PTX; compute
# capability 90 for H100/H200; x86-64-v3, not this CPU), plus the default
# model's tokenizer files, as that host has no internet to fetch them.
#
#   scripts/gpu_build.sh             # then carry target/gpu
#   WICK_GPU_TESTS="cuda_kernels greedy_parity" scripts/gpu_build.sh
#
# The build is scripts/cuda_build.sh's; the collection below runs in its
# environment, via its trailing command (this script again, with --collect).
# Any of the three settings may be overridden, e.g. to try the collection
# against an existing 13.4 build.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" != --collect ]; then
    export WICK_CUDA_VERSION=${WICK_CUDA_VERSION:-13.0}
    export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
    export RUSTFLAGS=${RUSTFLAGS:--C target-cpu=x86-64-v3}
    # Only the binaries: the test targets wanted are built below, not all ~25.
    export WICK_CUDA_BUILD_ARGS=--bins
    exec scripts/cuda_build.sh "$PWD/scripts/gpu_build.sh" --collect
fi

out=target/gpu
# Test targets to carry: the GPU tests (they skip themselves without a GPU).
wanted=${WICK_GPU_TESTS:-cuda_kernels}
have=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" in t["kind"]:
            print(t["name"])')
args=()
for t in $wanted; do
    if grep -qx "$t" <<<"$have"; then args+=(--test "$t"); else echo "no test target $t yet; skipped"; fi
done

rm -rf "$out" && mkdir -p "$out/tests" "$out/tokenizer"
# cargo names each executable in its JSON messages; the target name is the
# stable name (the file name carries a hash).
if [ ${#args[@]} -gt 0 ]; then
    cargo test --release --features cuda --no-run --message-format=json "${args[@]}" |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line) if line.startswith("{") else {}
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])' |
        while read -r name exe; do
            strip -o "$out/tests/$name" "$exe"
        done
fi
strip -o "$out/wick" "$CARGO_TARGET_DIR/release/wick"

# Tokenizer files of the default model (cuda_build.sh's check fetched it),
# for make_models.py there; the exported f32 weights are not needed.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$out/wick" export-hf --out "$tmp" >/dev/null
cp "$tmp"/tokenizer*.json "$tmp"/config.json "$tmp"/generation_config.json "$out/tokenizer/"

# What was built, for the table's heading; and where: tests find their
# fixtures through the build's CARGO_MANIFEST_DIR, which gpu_check.sh links
# to the copy of the repo there.
echo "$(git describe --always --dirty 2>/dev/null || echo '?') built $(date -u +%F)," \
    "CUDA $WICK_CUDA_VERSION, sm_$CUDA_COMPUTE_CAP, RUSTFLAGS ${RUSTFLAGS:-(.cargo/config.toml)}" >"$out/build.txt"
pwd >"$out/manifest_dir"

# The upload limit is 64 MiB per call.
find "$out/wick" "$out/tests" -type f -exec gzip -9 {} +
du -ab "$out" | sort -k2 | awk '{ printf "%10.1f MiB  %s\n", $1 / 1048576, $2 }'
total=$(du -sb "$out" | cut -f1)
if [ "$total" -gt $((60 << 20)) ]; then
    echo "bundle is $((total >> 20)) MiB, over the 60 MiB budget: trim WICK_GPU_TESTS" >&2
    exit 1
fi
echo "bundle: $out, $((total >> 20)) MiB; carry it as target/gpu"
