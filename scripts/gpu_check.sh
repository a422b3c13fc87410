#!/usr/bin/env bash
# The one command a GPU session runs (docs/gpu.md), from the repo root with
# target/gpu carried (scripts/gpu_build.sh). No internet there, so everything
# comes from the bundle and the host's PyTorch + transformers.
#
#   WICK_GPU_CHECK_LOGS=$OUT scripts/gpu_check.sh [--quick] [--l8b]
#
# Stages: CUDA test binaries; random-weight checkpoints (s135, l1b; l8b with
# --l8b); parity against transformers (bf16, and f32 for s135); streaming
# load on l1b at 1, 32 and 128 streams; `wick bench`; transformers' own
# `generate` at static batch 32 and 128. --quick drops the 128-stream and
# transformers stages. Each stage has its own time limit and the whole run a
# budget (WICK_GPU_CHECK_BUDGET seconds, default 450); a failed or skipped
# stage says so in the table, which is printed last whatever happens.
#
# WICK_GPU_CHECK_DEVICE=cpu runs the same stages on the CPU with small
# sizes and s135 only (using target/release/wick if there is no bundle), so
# the script itself can be tried on a machine without a GPU.
set -uo pipefail # no -e: a stage's failure is a row in the table, not the end
cd "$(dirname "$0")/.." || exit

quick=0 l8b=0
for a in "$@"; do
    case $a in
    --quick) quick=1 ;;
    --l8b) l8b=1 ;;
    *) echo "usage: $0 [--quick] [--l8b]" >&2; exit 2 ;;
    esac
done
device=${WICK_GPU_CHECK_DEVICE:-cuda}
work=${WICK_GPU_CHECK_DIR:-/tmp/wick-gpu-check}
logs=${WICK_GPU_CHECK_LOGS:-$work/logs}
budget=${WICK_GPU_CHECK_BUDGET:-450}
port=${WICK_GPU_CHECK_PORT:-18431}
rm -rf "$work" && mkdir -p "$work/bin" "$logs"
table=$logs/table.tsv
: >"$table"
server=
hw="?"

row() { printf '%s\t%s\n' "$1" "$2" >>"$table"; }
# A log's last line with text, for a failure's row (progress bars end in \r).
last_line() { tr '\r' '\n' <"$1" | grep -v '^\s*$' | tail -n 1 | cut -c1-200; }
# Progress bars would fill the logs and the terminal's last lines; output
# unbuffered so that a stage cut short by its timeout leaves its lines.
export TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 PYTHONUNBUFFERED=1

print_table() {
    [ -n "$server" ] && kill "$server" 2>/dev/null
    echo
    echo "## wick GPU check: $device, $(date -u +%F), $(cat target/gpu/build.txt 2>/dev/null || echo 'local build'), ${SECONDS}s"
    echo
    echo "| figure | value | device |"
    echo "| --- | --- | --- |"
    while IFS=$'\t' read -r fig val; do
        echo "| $fig | ${val//|/\\|} | $hw |"
    done <"$table"
}
trap print_table EXIT
# Stopped, it still prints the table (once the running stage has ended).
trap 'exit 143' TERM INT

# stage NAME LIMIT CMD...: runs CMD under `timeout`, cut short to what is left
# of the budget; its output goes to the terminal and to $logs/NAME.log. A
# failure becomes a row holding its last line.
stage() {
    local name=$1 limit=$2 left=$((budget - SECONDS)) rc
    shift 2
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 15 ]; then
        row "$name" "skipped: out of time (budget ${budget}s)"
        return 1
    fi
    echo "== $name (limit ${limit}s, ${SECONDS}s in)"
    timeout -k 5 "$limit" "$@" 2>&1 | tee "$logs/${name// /_}.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        local why="exit $rc"
        [ "$rc" -eq 124 ] && why="timed out after ${limit}s"
        row "$name" "FAILED ($why): $(last_line "$logs/${name// /_}.log")"
    fi
    return "$rc"
}

# serve NAME DTYPE KV_MIB: starts wick on model NAME and waits (at most 240s,
# or what is left of the budget) until it has loaded; a row if it fails.
serve() {
    local log=$logs/serve_$1_$2.log t=$SECONDS
    stop
    if [ $((budget - SECONDS)) -lt 15 ]; then
        row "serve $1 $2" "skipped: out of time (budget ${budget}s)"
        return 1
    fi
    echo "== serve $1 $2 (${SECONDS}s in)"
    # Without backtraces, wick's errors are a line or two (CI sets RUST_BACKTRACE).
    env -u RUST_BACKTRACE -u RUST_LIB_BACKTRACE \
        "$wick" serve --device "$device" --model "$work/models/$1" --dtype "$2" \
        --kv-cache-memory "$3" --port "$port" >"$log" 2>&1 &
    server=$!
    while [ $((SECONDS - t)) -lt 240 ] && [ "$SECONDS" -lt "$budget" ]; do
        curl -sf "$base/health" >/dev/null && echo "loaded in $((SECONDS - t))s" && return 0
        kill -0 "$server" 2>/dev/null || break
        sleep 1
    done
    tail -n 5 "$log"
    row "serve $1 $2" "FAILED: $(grep -m 1 -A 3 '^error' "$log" | tr '\n' ' ' | cut -c1-300)"
    stop
    return 1
}
stop() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    server=
}
base=http://127.0.0.1:$port

# Libraries: the host's driver, and cuBLAS/cudart/cuRAND from PyTorch's wheels
# (nvidia/cu13/lib; older wheels had one lib dir per library), or a toolkit.
if [ "$device" != cpu ]; then
    nvlib=$(python3 -c 'import glob, nvidia
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(p + "/*/lib"))))')
    export LD_LIBRARY_PATH=$nvlib:/usr/local/nvidia/lib64:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    hw=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,temperature.gpu,power.draw \
        --format=csv
else
    hw="$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n 1), $(nproc) threads"
fi
echo "device: $hw"

# The bundle, or on the CPU a local build.
if [ -f target/gpu/wick.gz ]; then
    gunzip -c target/gpu/wick.gz >"$work/bin/wick"
    for t in target/gpu/tests/*.gz; do
        [ -e "$t" ] && gunzip -c "$t" >"$work/bin/test-$(basename "$t" .gz)"
    done
    chmod +x "$work"/bin/*
    wick=$work/bin/wick tok=target/gpu/tokenizer
    # Tests find tests/fixtures through the build machine's repo path.
    md=$(cat target/gpu/manifest_dir 2>/dev/null)
    if [ -n "$md" ] && [ ! -e "$md" ]; then
        mkdir -p "$(dirname "$md")" && ln -s "$PWD" "$md" || echo "cannot link $md: fixture tests may fail"
    fi
elif [ "$device" = cpu ] && [ -x target/release/wick ]; then
    wick=target/release/wick tok=$work/tokenizer
    stage "tokenizer export" 120 "$wick" export-hf --out "$work/export" &&
        mkdir -p "$tok" && cp "$work"/export/{tokenizer*.json,config.json,generation_config.json} "$tok/"
    rm -rf "$work/export"
else
    row bundle "FAILED: no target/gpu/wick.gz (run scripts/gpu_build.sh and carry target/gpu)"
    exit 1
fi
"$wick" --version
# A library the binary links and the host lacks stops every stage: say which.
missing=$(ldd "$wick" | awk '/not found/ { printf "%s ", $1 }')
[ -n "$missing" ] && row libraries "FAILED: not found on LD_LIBRARY_PATH: $missing"

# Sizes: the GPU figures, or a CPU run small enough to finish in minutes.
if [ "$device" = cpu ]; then
    models=(s135) load_model=s135 load_dtype=f32 kv=512
    in=32 out=16 levels=(2) bench_batch=1,2 bench_in=64 bench_out=16
else
    models=(s135 l1b) load_model=l1b load_dtype=bf16 kv=4096
    in=128 out=128 levels=(1 32 128) bench_batch=1,32,128 bench_in=512 bench_out=64
    [ $quick = 1 ] && levels=(1 32) bench_batch=1,32
fi
[ $l8b = 1 ] && models+=(l8b)

# The CUDA tests (in a CPU run there are none). cwd is the repo root, as cargo's.
for t in "$work"/bin/test-*; do
    [ -e "$t" ] || continue
    name=${t##*/test-}
    if stage "test $name" 120 "$t" --nocapture; then
        # Tests without a device pass after saying "skipping"; count those.
        row "cargo test $name" "$(grep '^test result' "$logs/test_$name.log" | tail -n 1 |
            sed 's/^test result: //; s/; 0 measured.*//'), $(grep -c skipping "$logs/test_$name.log") said skipping"
    fi
done

# One model at a time, made then checked: what fits the budget is complete.
for m in "${models[@]}"; do
    ref=$work/models/$m.ref.json
    stage "make $m" 300 python3 scripts/gpu/make_models.py "$work/models" "$tok" "$m" || continue
    dtypes=(bf16)
    [ "$m" = s135 ] && dtypes=(f32 bf16)
    for dt in "${dtypes[@]}"; do
        mkv=$kv
        [ "$m" = l8b ] && mkv=16384
        serve "$m" "$dt" "$mkv" || continue
        # bf16 rounding alone moves a random model's log-probs by ~0.15
        # (transformers' own bf16 against its fp32, in the table); f32 is exact.
        delta=0.05
        [ "$dt" = bf16 ] && delta=0.3
        stage "parity $m $dt" 60 python3 scripts/gpu/parity.py "$base" "$ref" "$m $dt" \
            --max-delta "$delta" --table "$table"
        if [ "$m" = "$load_model" ] && [ "$dt" = "$load_dtype" ] || [ "$m" = l8b ]; then
            for c in "${levels[@]}"; do
                [ "$m" = l8b ] && [ "$c" -gt 32 ] && continue
                n=$((c > 1 ? 2 * c : 8))
                [ "$c" -ge 128 ] && n=$c
                stage "load $m $dt c$c" 150 python3 scripts/gpu/load.py "$base" -c "$c" -n "$n" \
                    --prompt-tokens "$in" --max-tokens "$out" --label "$m $dt" --table "$table"
            done
        fi
    done
    stop
done

# The engine without HTTP. bench has no --dtype: a checkpoint loads as f32.
# (The reference is written last: with it, the checkpoint is whole.)
if [ -f "$work/models/$load_model.ref.json" ]; then
    if stage "bench $load_model" 150 "$wick" bench --device "$device" --model "$work/models/$load_model" \
        --kv-cache-memory "$kv" --batch "$bench_batch" --prompt-tokens "$bench_in" \
        --decode-tokens "$bench_out"; then
        # Its last line is JSON: [{"prefill_tok_s": P, "decode_tok_s": [[batch, tok/s], ...]}].
        row "wick bench $load_model (f32 weights, engine only)" "$(tail -n 1 "$logs/bench_$load_model.log" | python3 -c '
import json, sys
r = json.load(sys.stdin)[0]
decode = ", ".join("@%d %.0f" % (b, t) for b, t in r["decode_tok_s"])
print("prefill %.0f tok/s; decode %s tok/s" % (r["prefill_tok_s"], decode))')"
    fi
fi

if [ $quick = 0 ] && [ -f "$work/models/$load_model.ref.json" ]; then
    stage "transformers $load_model" 180 python3 scripts/gpu/hf_generate.py "$work/models/$load_model" \
        --batch 32 128 --prompt-tokens "$in" --max-tokens "$out" --label "$load_model" --table "$table"
fi
