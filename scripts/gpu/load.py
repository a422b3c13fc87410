#!/usr/bin/env python3
"""Streaming load on an OpenAI-compatible server: N completions, C in flight at a time,
each a P-token prompt and exactly M output tokens (`ignore_eos`). Reports output tok/s
over the whole run, time to first token (TTFT) and inter-token latency (ITL, the gaps
between streamed chunks) at p50 and p99.

usage: load.py BASE_URL -c 32 -n 64 [--prompt-tokens 128] [--max-tokens 128]
               [--label L] [--table FILE]

Prompts are random token ids, different in every request (and every run), so they have
exactly P tokens without a tokenizer and a prefix cache cannot skip their prefill.
--table appends one tab-separated row (figure, value) for scripts/gpu_check.sh."""
import argparse
import asyncio
import json
import random
import sys
import time

import httpx


async def one(client, base_url, model, prompt, max_tokens):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    t0, times, tokens = time.perf_counter(), [], 0
    async with client.stream("POST", f"{base_url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            ev = json.loads(line[5:])
            if ev.get("choices") and ev["choices"][0].get("text"):
                times.append(time.perf_counter())
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
    if not times:
        raise RuntimeError("no tokens streamed")
    return t0, times, tokens or len(times)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


async def run(args):
    rng = random.Random()
    prompts = [[rng.randrange(100, args.vocab) for _ in range(args.prompt_tokens)]
               for _ in range(args.num_requests)]
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    async with httpx.AsyncClient(limits=limits, timeout=args.timeout) as client:
        model = (await client.get(f"{args.base_url}/v1/models")).json()["data"][0]["id"]
        # One request first, untimed: the first on a GPU pays for kernel loading.
        await one(client, args.base_url, model,
                  [rng.randrange(100, args.vocab) for _ in range(args.prompt_tokens)], 4)
        sem = asyncio.Semaphore(args.concurrency)

        async def worker(p):
            async with sem:
                try:
                    return await one(client, args.base_url, model, p, args.max_tokens)
                except Exception as e:  # counted, and the run goes on
                    return f"{type(e).__name__}: {e}"

        start = time.perf_counter()
        results = await asyncio.gather(*(worker(p) for p in prompts))
        wall = time.perf_counter() - start
    ok = [r for r in results if not isinstance(r, str)]
    errors = sorted({r for r in results if isinstance(r, str)})
    ttft = [times[0] - t0 for t0, times, _ in ok]
    itl = [b - a for _, times, _ in ok for a, b in zip(times, times[1:])]
    tokens = sum(n for _, _, n in ok)
    return {"label": args.label, "concurrency": args.concurrency, "requests": len(results),
            "ok": len(ok), "errors": errors[:3], "output_tokens": tokens,
            "wall_s": round(wall, 2), "output_tok_s": round(tokens / wall, 1),
            "ttft_ms_p50": round(1000 * pct(ttft, 50), 1),
            "ttft_ms_p99": round(1000 * pct(ttft, 99), 1),
            "itl_ms_p50": round(1000 * pct(itl, 50), 2),
            "itl_ms_p99": round(1000 * pct(itl, 99), 2)}


def main():
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("base_url")
    ap.add_argument("-c", "--concurrency", type=int, default=1)
    ap.add_argument("-n", "--num-requests", type=int, default=None, help="default: 2 * c")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=32000, help="prompt ids are below this")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--label", default="")
    ap.add_argument("--table")
    args = ap.parse_args()
    args.base_url = args.base_url.rstrip("/")
    args.num_requests = args.num_requests or 2 * args.concurrency
    out = asyncio.run(run(args))
    print(json.dumps(out))
    if args.table:
        value = (f"{out['output_tok_s']} tok/s; TTFT p50/p99 {out['ttft_ms_p50']}/"
                 f"{out['ttft_ms_p99']} ms; ITL p50/p99 {out['itl_ms_p50']}/"
                 f"{out['itl_ms_p99']} ms; {out['ok']}/{out['requests']} ok")
        with open(args.table, "a") as f:
            f.write(f"wick {args.label} c={args.concurrency}, {args.prompt_tokens} in/"
                    f"{args.max_tokens} out\t{value}\n")
    return 0 if out["ok"] == out["requests"] else 1


if __name__ == "__main__":
    sys.exit(main())
