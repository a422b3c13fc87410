#!/usr/bin/env python3
"""Decode throughput with every row under a JSON schema, against free rows.

Runs against a started `wick serve`: C concurrent chat requests, each made to
generate exactly --max-tokens tokens, either unconstrained (ignore_eos) or
under a JSON schema that cannot be complete before max_tokens (a long list
of strings), so both sides decode the same number of tokens. Rounds
alternate between the two; prints output tok/s per round and the ratio of
the medians as one JSON line. Only dependency: httpx.

    python3 scripts/bench_constrained.py --base-url http://127.0.0.1:8000 -c 8
"""
import argparse
import asyncio
import json
import statistics
import time

import httpx

SCHEMA = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "string"}, "minItems": 500}},
    "required": ["items"],
}


async def one(client, args, constrained, seed):
    body = {
        "messages": [{"role": "user", "content": f"List things you might find in a kitchen ({seed})."}],
        "max_tokens": args.max_tokens,
        "temperature": 1.0,
        "seed": seed,
    }
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "list", "schema": SCHEMA}}
    else:
        body["ignore_eos"] = True
    r = await client.post(f"{args.base_url}/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    d = r.json()
    assert d["choices"][0]["finish_reason"] == "length", d
    return d["usage"]["completion_tokens"]


async def round_(client, args, constrained, k):
    t0 = time.perf_counter()
    tokens = await asyncio.gather(*(one(client, args, constrained, 1000 * k + i) for i in range(args.concurrency)))
    return sum(tokens) / (time.perf_counter() - t0)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("-c", "--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    free, constrained = [], []
    async with httpx.AsyncClient() as client:
        await round_(client, args, True, 99)  # warm-up: first grammar, first pages
        for k in range(args.rounds):
            free.append(await round_(client, args, False, k))
            constrained.append(await round_(client, args, True, k))
    res = {
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "free_tok_s": [round(x, 1) for x in free],
        "constrained_tok_s": [round(x, 1) for x in constrained],
        "constrained_over_free": round(statistics.median(constrained) / statistics.median(free), 3),
    }
    print(json.dumps(res))


asyncio.run(main())
