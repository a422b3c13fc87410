#!/usr/bin/env python3
"""A running `wick serve`'s log-probs and greedy tokens against transformers'
(a REF_JSON from make_models.py), over the OpenAI completions API.

usage: parity.py BASE_URL REF_JSON LABEL [--max-delta 0.05] [--table FILE]

Three figures, all on token-id prompts (no tokenizer in the way):
- prefill: the prompt's log-probs (`echo` + `logprobs`) against transformers fp32;
- decode: the log-probs of the greedy tokens wick generates itself, for as long as they
  agree with transformers' greedy tokens, against transformers fp32 on those tokens;
- greedy: how many of the 32 greedy tokens agree with transformers' (fp32 and bf16),
  from the start. Ties break differently across dtypes, so this is reported, not gated.
Exits 1 when the larger max |delta| exceeds --max-delta; --table appends one
tab-separated row (figure, value) for scripts/gpu_check.sh's table."""
import argparse
import json
import sys

import httpx


def complete(client, base, model, **body):
    r = client.post(f"{base}/v1/completions", json={"model": model, "temperature": 0, **body})
    if r.status_code != 200:
        sys.exit(f"completion request failed: HTTP {r.status_code} {r.text[:300]}")
    return r.json()["choices"][0]


def deltas(a, b):
    d = [abs(x - y) for x, y in zip(a, b)]
    return (max(d), sum(d) / len(d)) if d else (0.0, 0.0)


def main():
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("base_url")
    ap.add_argument("ref_json")
    ap.add_argument("label")
    ap.add_argument("--max-delta", type=float, default=0.05)
    ap.add_argument("--table")
    args = ap.parse_args()
    base, ref = args.base_url.rstrip("/"), json.load(open(args.ref_json))
    ids, k = ref["ids"], ref["prefix"]
    client = httpx.Client(timeout=300)
    model = client.get(f"{base}/v1/models").json()["data"][0]["id"]

    # Prefill. wick refuses max_tokens 0, so one token is generated and ignored.
    lp = complete(client, base, model, prompt=ids, echo=True, logprobs=1, max_tokens=1)
    lp = lp["logprobs"]["token_logprobs"][1:len(ids)]
    f32, b16 = ref["prompt_lp_float32"], ref["prompt_lp_bfloat16"]
    pmax, pmean = deltas(lp, f32)
    tmax, tmean = deltas(b16, f32)
    print(f"{args.label}: prefill log-probs vs transformers fp32: max |d| {pmax:.4f} "
          f"mean {pmean:.4f} (transformers' own bf16: max {tmax:.4f} mean {tmean:.4f})")

    # Greedy, decoded by wick. Its token strings are compared with the strings wick
    # renders for transformers' ids (echoed back), so both come from one detokenizer.
    gen = complete(client, base, model, prompt=ids[:k], max_tokens=32, logprobs=1,
                   ignore_eos=True)["logprobs"]
    agree = {}
    for dt in ("float32", "bfloat16"):
        want = complete(client, base, model, prompt=ids[:k] + ref[f"greedy_{dt}"], echo=True,
                        logprobs=1, max_tokens=1)["logprobs"]["tokens"][k:k + 32]
        n = 0
        while n < min(len(want), len(gen["tokens"])) and want[n] == gen["tokens"][n]:
            n += 1
        agree[dt] = n
    n = agree["float32"]
    dmax, dmean = deltas(gen["token_logprobs"][:n], ref["greedy_lp_float32"][:n])
    decode = f"{dmax:.4f}/{dmean:.4f} over {n}" if n else "n/a (first token differs)"
    print(f"{args.label}: decode log-probs of the greedy tokens agreeing with transformers "
          f"fp32, max/mean |d|: {decode}")
    print(f"{args.label}: greedy tokens agreeing from the start: with transformers fp32 "
          f"{agree['float32']}/32, with bf16 {agree['bfloat16']}/32")

    worst = max(pmax, dmax)
    ok = worst <= args.max_delta
    value = (f"prefill max/mean Δ {pmax:.4f}/{pmean:.4f}, decode {decode}; "
             f"greedy {agree['float32']}/32 (fp32 ref), {agree['bfloat16']}/32 (bf16 ref); "
             f"HF bf16 max {tmax:.3f}; {'ok' if ok else 'FAIL'} at {args.max_delta}")
    if args.table:
        with open(args.table, "a") as f:
            f.write(f"parity {args.label}\t{value}\n")
    if not ok:
        print(f"{args.label}: max |d| {worst:.4f} > {args.max_delta}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
