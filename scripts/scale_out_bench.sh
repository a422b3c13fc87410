#!/usr/bin/env bash
# Two wick replicas behind nginx (the shipped deploy/nginx/wick.conf on
# loopback ports) against one replica direct, under the same load:
#
#   scripts/scale_out_bench.sh LOADGEN [loadgen options...]
#   scripts/scale_out_bench.sh scripts/loadgen.py -n 64 -c 16 --max-tokens 64
#
# Runs one setup at a time and prints loadgen's summary for each. Needs
# nginx and a release build (target/release/wick).
set -euo pipefail
cd "$(dirname "$0")/.."
loadgen=$1
shift
wick=${WICK_BIN:-target/release/wick}
dir=$(mktemp -d)
pids=()
cleanup() {
    kill "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

start_wick() { # port
    RUST_LOG=warn "$wick" serve --port "$1" >/dev/null 2>&1 &
    pids+=($!)
    until curl -sf "http://127.0.0.1:$1/health" >/dev/null; do sleep 0.2; done
}

start_wick 8101
start_wick 8102
sed -e 's/127\.0\.0\.1:8001/127.0.0.1:8101/; s/127\.0\.0\.1:8002/127.0.0.1:8102/' \
    -e 's/listen 8000;/listen 127.0.0.1:8100;/' deploy/nginx/wick.conf >"$dir/wick.conf"
cat >"$dir/nginx.conf" <<CONF
daemon off;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    include $dir/wick.conf;
}
CONF
nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" &
pids+=($!)
until curl -sf http://127.0.0.1:8100/health >/dev/null; do sleep 0.2; done

echo "== two replicas through nginx"
python3 "$loadgen" --base-url http://127.0.0.1:8100 --label nginx-2 "$@"
for port in 8101 8102; do
    printf 'replica %s served: ' "$port"
    curl -s "http://127.0.0.1:$port/metrics" |
        awk '/^wick:request_success_total/ { n += $NF } END { print n }'
done
# The second replica stops, so the direct run has the machine to itself.
kill "${pids[1]}"
echo "== one replica direct"
python3 "$loadgen" --base-url http://127.0.0.1:8101 --label direct-1 "$@"
