#!/usr/bin/env python3
"""Single-stream decode after a long prompt, for any OpenAI-compatible server:
a prompt of random common words (about --words tokens), then --max-tokens
greedy tokens with ignore_eos, streamed; decode tok/s is the tokens after
the first over the time after the first. Each request's prompt differs in
its last word, so a prefix cache reuses all but the end of it, as in a long
chat. Ends with one JSON line.

    python3 scripts/bench_long_context.py --base-url http://127.0.0.1:8000 --words 3000
"""

import argparse
import json
import random
import statistics
import time

import httpx

WORDS = (
    "the of and to in is was for on that with as by at from his her an be this which or "
    "had are not but were have one all their been has more when who will also no its there "
    "would two into them can other than only"
).split()


def one(client, base, model, prompt, max_tokens):
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    first = last = None
    tokens = 0
    # A fresh connection each: llama-server closes a streamed response's.
    headers = {"Connection": "close"}
    with client.stream("POST", f"{base}/v1/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                now = time.perf_counter()
                first = first or now
                last = now
                tokens += 1
    return (tokens - 1) / (last - first)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None)
    ap.add_argument("--words", type=int, default=3000)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--requests", type=int, default=3)
    a = ap.parse_args()
    rng = random.Random(1)
    prompt = " ".join(rng.choice(WORDS) for _ in range(a.words))
    with httpx.Client(timeout=600) as client:
        model = a.model or client.get(f"{a.base_url}/v1/models").json()["data"][0]["id"]
        rates = [
            one(client, a.base_url, model, f"{prompt} {i}", a.max_tokens)
            for i in range(a.requests)
        ]
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                "words": a.words,
                "decode_tok_s": [round(r, 1) for r in rates],
                "median": round(statistics.median(rates), 1),
            }
        )
    )


if __name__ == "__main__":
    main()
