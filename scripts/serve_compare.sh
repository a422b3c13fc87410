#!/usr/bin/env bash
# Serves one GGUF with wick and then with llama-server, one at a time (a
# 30B-class file fits in memory once, not twice), and for each reports:
# load time (process start to /health answering 200), peak resident memory
# (VmHWM) after load and after the run, and loadgen's figures under load.
#
#   scripts/serve_compare.sh MODEL.gguf LLAMA_BIN_DIR [loadgen options]
#
# Defaults to the 32-stream workload of docs/performance.md:
# -n 64 -c 32 --prompt-tokens 128 --max-tokens 64 --warmup 2 --seed 7.
# llama-server gets its best CPU settings here: 2 threads, 32 slots with
# continuous batching, 256 tokens of context per slot, default repacking.
# Each server's JSON line is appended to serve_compare.jsonl in the working
# directory, labelled; wick's /metrics after the run is kept in
# serve_compare_wick_metrics.txt (per-expert routing counts for a MoE).
set -euo pipefail
model=$1 bin=$2
shift 2
opts=("$@")
[ ${#opts[@]} -eq 0 ] && opts=(-n 64 -c 32 --prompt-tokens 128 --max-tokens 64 --warmup 2 --seed 7)
here=$(cd "$(dirname "$0")" && pwd)
wick=${WICK:-$here/../target/release/wick}
port=18400

if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then
    echo "port $port is taken: stop what serves it first" >&2
    exit 1
fi
hwm() { awk '/VmHWM/ {printf "%.2f", $2 / 1048576}' "/proc/$1/status"; }

run() {
    local label=$1
    shift
    local start pid loaded
    start=$(date +%s.%N)
    "$@" >/tmp/serve_compare_$label.log 2>&1 &
    pid=$!
    # Expanded now: $pid is local, and gone by the time the shell exits.
    trap "kill $pid 2>/dev/null || true" EXIT
    until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
        kill -0 $pid 2>/dev/null || { echo "$label died:"; tail -5 /tmp/serve_compare_$label.log; exit 1; }
        sleep 0.2
    done
    loaded=$(echo "$(date +%s.%N) - $start" | bc)
    echo "$label: loaded in ${loaded}s, peak RSS $(hwm $pid) GiB"
    python3 "$here/loadgen.py" --base-url "http://127.0.0.1:$port" "${opts[@]}" \
        --server-pid $pid --label "$label" --json-out serve_compare.jsonl >/dev/null || true
    echo "$label: peak RSS after the run $(hwm $pid) GiB"
    [ "$label" = wick ] && curl -s "http://127.0.0.1:$port/metrics" >serve_compare_wick_metrics.txt
    kill $pid
    wait $pid 2>/dev/null || true
}

run wick "$wick" serve --model "$model" --port $port
LD_LIBRARY_PATH=$bin run llama "$bin/llama-server" -m "$model" --port $port -t 2 -np 32 -cb -c 8192
python3 - <<'PY'
import json
for line in open("serve_compare.jsonl").readlines()[-2:]:
    r = json.loads(line)
    print(f"{r['label']}: {r['output_tok_s']:.1f} output tok/s, TTFT p50/p99 {r['ttft_ms_p50']:.0f}/"
          f"{r['ttft_ms_p99']:.0f} ms, ITL p50/p99 {r['itl_ms_p50']:.0f}/{r['itl_ms_p99']:.0f} ms")
PY
