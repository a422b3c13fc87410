"""Greedy continuations from a running llama-server, in the format of
tests/fixtures/llama-cpp/greedy.jsonl: per prompt, llama.cpp's generated ids
at temperature 0 and, per step, the logprob gap between its top two tokens.

    python3 scripts/llama_greedy_reference.py --base-url http://127.0.0.1:8080 \
        --prompts tests/fixtures/llama-cpp/greedy.jsonl --out ref.jsonl

With WICK_PARITY_MODEL=<the server's GGUF> WICK_PARITY_REFERENCE=ref.jsonl,
`cargo test --release --test greedy_parity` checks wick's teacher-forced
choices on that file against these. Needs only the standard library.
"""

import argparse
import json
import urllib.request


def complete(base: str, prompt: str, n: int) -> dict:
    body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0, "n_probs": 2,
                       "cache_prompt": False, "return_tokens": True}).encode()
    req = urllib.request.Request(base + "/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.load(r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--prompts", required=True, help="a JSONL file with a `prompt` per line")
    ap.add_argument("--out", required=True)
    ap.add_argument("-n", type=int, default=32, help="tokens per prompt")
    args = ap.parse_args()
    with open(args.prompts) as f, open(args.out, "w") as out:
        for line in f:
            prompt = json.loads(line)["prompt"]
            r = complete(args.base_url, prompt, args.n)
            steps = r["completion_probabilities"]
            gaps = [round(s["top_logprobs"][0]["logprob"] - s["top_logprobs"][1]["logprob"], 4) for s in steps]
            out.write(json.dumps({"prompt": prompt, "ids": r["tokens"], "text": r["content"], "top2_gap": gaps}) + "\n")


if __name__ == "__main__":
    main()
