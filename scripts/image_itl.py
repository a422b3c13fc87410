"""Inter-token latency of running text streams while images are encoded:
STREAMS chat streams decode (temperature 0, ignore_eos) on a server at
127.0.0.1:PORT (wick or llama-server); once they have decoded for WARM
seconds, each PNG is sent in turn as a data-URL chat request for one
token; when the last is answered the streams are closed. Prints the
streams' token gaps (p50, p99, max) before the images and while they were
encoded, and each image's time to first token. Give each run PNGs the
server has not seen: a server may keep an image's encoding.

    python3 scripts/image_itl.py PORT IMAGE.png ... [--streams 4] [--warm 10]
"""
import argparse, base64, http.client, json, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("port", type=int)
ap.add_argument("images", nargs="+")
ap.add_argument("--streams", type=int, default=4)
ap.add_argument("--warm", type=float, default=10.0)
args = ap.parse_args()

stop = threading.Event()
times = [[] for _ in range(args.streams)]


def post(body):
    conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=3600)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    return conn, conn.getresponse()


def stream(i):
    body = {"messages": [{"role": "user", "content": f"Story {i}: tell me a very long story."}],
            "max_tokens": 4000, "temperature": 0, "ignore_eos": True, "stream": True}
    conn, resp = post(body)
    while not stop.is_set():
        line = resp.readline()
        if not line:
            break
        if line.startswith(b"data: {"):
            chunk = json.loads(line[6:])
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                times[i].append(time.time())
    conn.close()


def image(path):
    b64 = base64.b64encode(open(path, "rb").read()).decode()
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe this picture."},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}}]}],
            "max_tokens": 1, "temperature": 0}
    conn, resp = post(body)
    out = json.loads(resp.read())
    conn.close()
    return out["usage"]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


threads = [threading.Thread(target=stream, args=(i,)) for i in range(args.streams)]
for t in threads:
    t.start()
time.sleep(args.warm)
t0 = time.time()
for path in args.images:
    start = time.time()
    usage = image(path)
    print(f"{path}: time to first token {time.time() - start:.2f} s ({usage['prompt_tokens']} prompt tokens)")
t1 = time.time()
time.sleep(1.0)
stop.set()
for t in threads:
    t.join()

before, during = [], []
for ts in times:
    for a, b in zip(ts, ts[1:]):
        if b < t0:
            before.append(b - a)
        elif b <= t1:
            during.append(b - a)
for name, gaps in [("before the images", before), ("while encoding", during)]:
    print(f"{name}: {len(gaps)} gaps, p50 {1000 * pct(gaps, 0.5):.0f} ms, "
          f"p99 {1000 * pct(gaps, 0.99):.0f} ms, max {1000 * max(gaps, default=float('nan')):.0f} ms")
tokens = sum(1 for ts in times for x in ts if t0 <= x <= t1)
print(f"stream tokens while encoding: {tokens} in {t1 - t0:.1f} s ({tokens / (t1 - t0):.1f} tok/s)")
