#!/usr/bin/env python3
"""Copy-heavy chat workload for speculative decoding: each request asks the
model to repeat or edit a text or code block given in the prompt (with
--predict, also sent as OpenAI's `prediction`), one
request at a time (a single stream), greedy (or, with --temperature,
sampled with a seed per request, so that servers draw the same tokens),
streamed. Reports decode tok/s
(tokens after the first over the time after the first), TTFT and the
server's own draft counts where its usage has them, and ends with one JSON
line (--json-out appends it) so runs against several servers compare.

    python3 scripts/bench_copy.py --base-url http://127.0.0.1:8000 --label wick-ngram
"""

import argparse
import json
import statistics
import time

import httpx

CODE = '''def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
'''

PROSE = (
    "The library opens at nine in the morning and closes at six in the evening. "
    "Books may be borrowed for three weeks and renewed twice, unless another reader "
    "has reserved them. Late returns cost ten cents a day. The reading room on the "
    "second floor is kept quiet, and laptops are welcome at the long tables by the windows."
)

JSON_DOC = json.dumps(
    {
        "name": "wick",
        "version": "0.1.0",
        "features": ["continuous batching", "paged KV cache", "prefix caching"],
        "limits": {"max_num_seqs": 256, "max_num_batched_tokens": 512},
    },
    indent=2,
)

CODE_BLOCK = f"```python\n{CODE}```"
JSON_BLOCK = f"```json\n{JSON_DOC}\n```"

# Each task with the text it works on: what an editor would send as the
# request's `prediction` (--predict).
TASKS = [
    (f"Repeat this code exactly, in a code block:\n{CODE_BLOCK}", CODE_BLOCK),
    (f"Rename the function to rolling_mean and repeat the whole code:\n{CODE_BLOCK}", CODE_BLOCK),
    (f"Repeat this paragraph word for word:\n\n{PROSE}", PROSE),
    (f"Rewrite this paragraph with 'library' replaced by 'archive':\n\n{PROSE}", PROSE),
    (f"Repeat this JSON exactly:\n{JSON_BLOCK}", JSON_BLOCK),
    (f"Change the version to 0.2.0 and repeat the JSON:\n{JSON_BLOCK}", JSON_BLOCK),
    (f"Add a docstring to this function and repeat it:\n{CODE_BLOCK}", CODE_BLOCK),
    (f"Copy this text, then say how many sentences it has:\n\n{PROSE}", PROSE),
]


def one(client, base, model, task, max_tokens, prediction=None, temperature=0.0, seed=0):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": task}],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if prediction is not None:
        body["prediction"] = {"type": "content", "content": prediction}
    start = time.perf_counter()
    first = last = None
    usage = None
    pieces = 0
    # A fresh connection each: llama-server closes a streamed response's
    # connection, and a reused one would fail the next request.
    headers = {"Connection": "close"}
    with client.stream("POST", f"{base}/v1/chat/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                if c.get("delta", {}).get("content"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    pieces += 1
    tokens = (usage or {}).get("completion_tokens", pieces)
    return {
        "ttft": (first or time.perf_counter()) - start,
        "decode_s": (last - first) if first else 0.0,
        "tokens": tokens,
        "details": (usage or {}).get("completion_tokens_details") or {},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="passes over the tasks")
    ap.add_argument(
        "--predict",
        action="store_true",
        help="send the text each task works on as the request's prediction",
    )
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--label", default="")
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    with httpx.Client(timeout=600) as client:
        model = a.model or client.get(f"{a.base_url}/v1/models").json()["data"][0]["id"]
        one(client, a.base_url, model, "Say hi.", 8)  # warm-up
        runs = [
            one(
                client,
                a.base_url,
                model,
                t,
                a.max_tokens,
                p if a.predict else None,
                a.temperature,
                seed=i,
            )
            for _ in range(a.rounds)
            for i, (t, p) in enumerate(TASKS)
        ]
    tokens = sum(r["tokens"] - 1 for r in runs)
    decode_s = sum(r["decode_s"] for r in runs)
    accepted = sum(r["details"].get("accepted_prediction_tokens", 0) for r in runs)
    rejected = sum(r["details"].get("rejected_prediction_tokens", 0) for r in runs)
    result = {
        "label": a.label,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "requests": len(runs),
        "completion_tokens": sum(r["tokens"] for r in runs),
        "decode_tok_s": round(tokens / decode_s, 1) if decode_s else None,
        "ttft_p50_s": round(statistics.median(r["ttft"] for r in runs), 3),
        "accepted_prediction_tokens": accepted,
        "rejected_prediction_tokens": rejected,
    }
    print(
        f"{a.label}: decode {result['decode_tok_s']} tok/s over {result['completion_tokens']} "
        f"tokens, TTFT p50 {result['ttft_p50_s']} s, drafts kept {accepted} / {accepted + rejected}"
    )
    print(json.dumps(result))
    if a.json_out:
        with open(a.json_out, "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
