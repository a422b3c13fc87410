"""Checks that two wick builds answer alike: the same prompts, greedy and
seeded, streamed and whole, through chat, completions, Messages and
Responses, must give the same text and finish reasons. For a change meant to
alter no behaviour (a refactor), run it with the build before and after.

    python3 scripts/identity_check.py OLD_WICK NEW_WICK [--prompts 32] [--model M]

Each binary serves on its own port (`wick serve`, the default model unless
--model names one); exits 1 naming each answer that differs. Requests go
one at a time unless --concurrency says otherwise: batched rows may round
differently from rows alone, so only a fixed order compares exactly.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

TOPICS = [
    "the sea", "a lighthouse", "bread", "rain in a city", "an old map",
    "a violin", "snow", "a train station", "tea", "a fox", "the moon",
    "a library", "copper", "bees", "a bridge", "the desert", "a clock",
    "a garden", "thunder", "a ship", "autumn", "a mountain", "salt",
    "a candle", "the wind", "a river", "glass", "an owl", "a market",
    "ice", "a harbor", "paper",
]


def post(port: int, path: str, body: dict) -> str | list[str]:
    """The whole answer's JSON text, or a stream's data lines."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "x-api-key": "k"},
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        if not body.get("stream"):
            return resp.read().decode()
        return [
            line[6:].decode().strip()
            for line in resp
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]"
        ]


def without_ids(v):
    """`v` with every `id` left out: each answer's are its own."""
    if isinstance(v, dict):
        return {k: without_ids(x) for k, x in v.items() if k != "id"}
    if isinstance(v, list):
        return [without_ids(x) for x in v]
    return v


def text_of(api: str, answer) -> str:
    """What an answer says, and why it ended: ids and clocks left out."""
    if isinstance(answer, str):
        o = json.loads(answer)
        if api == "chat":
            return json.dumps([(c["message"], c["finish_reason"]) for c in o["choices"]])
        if api == "completions":
            return json.dumps([(c["text"], c["finish_reason"]) for c in o["choices"]])
        if api == "messages":
            return json.dumps([o["content"], o["stop_reason"], o["usage"]])
        return json.dumps([without_ids(o["output"]), o["status"]])
    events = [json.loads(d) for d in answer]
    if api == "chat":
        return json.dumps([(c.get("delta"), c.get("finish_reason")) for e in events for c in e["choices"]])
    if api == "completions":
        return json.dumps([(c["text"], c["finish_reason"]) for e in events for c in e["choices"]])
    if api == "messages":
        return json.dumps([e for e in events if e.get("type") != "message_start"])
    return json.dumps([
        (e["type"], e.get("delta"), e.get("text"))
        for e in events
        if e["type"].endswith(("delta", "done"))
    ])


def requests(n: int, model: str) -> list[tuple[str, str, str, dict]]:
    """(name, api, path, body): each prompt greedy and seeded, streamed and
    whole."""
    out = []
    for i, topic in enumerate((TOPICS * (n // len(TOPICS) + 1))[:n]):
        ask = f"Write two sentences about {topic}."
        for stream in (False, True):
            for temp in (0.0, 0.8):
                sampling = {"max_tokens": 40, "temperature": temp, "stream": stream}
                seed = {"seed": 1000 + i} if temp else {}
                tag = f"{i} {'stream' if stream else 'whole'} t={temp}"
                out.append((f"chat {tag}", "chat", "/v1/chat/completions", {
                    "model": model, "messages": [{"role": "user", "content": ask}], **sampling, **seed}))
                out.append((f"completions {tag}", "completions", "/v1/completions", {
                    "model": model, "prompt": f"A note on {topic}:", **sampling, **seed}))
                out.append((f"responses {tag}", "responses", "/v1/responses", {
                    "model": model, "input": ask, "max_output_tokens": 40, "temperature": temp,
                    "stream": stream, "store": False, **seed}))
                if not temp:
                    # Anthropic's Messages API has no seed.
                    out.append((f"messages {tag}", "messages", "/v1/messages", {
                        "model": model, "messages": [{"role": "user", "content": ask}], **sampling}))
    return out


def serve(binary: str, port: int, model: str | None) -> subprocess.Popen:
    cmd = [binary, "serve", "--port", str(port)] + (["--model", model] if model else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    sys.exit(f"{binary} did not become healthy")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--model")
    ap.add_argument("--concurrency", type=int, default=1)
    args = ap.parse_args()
    answers = []
    for binary, port in ((args.old, 18231), (args.new, 18232)):
        proc = serve(binary, port, args.model)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models") as r:
                reqs = requests(args.prompts, json.load(r)["data"][0]["id"])
            with ThreadPoolExecutor(args.concurrency) as pool:
                answers.append(list(pool.map(
                    lambda r: text_of(r[1], post(port, r[2], r[3])), reqs)))
        finally:
            proc.terminate()
            proc.wait()
    differ = [r[0] for r, a, b in zip(reqs, *answers) if a != b]
    for name in differ:
        print("differs:", name)
    print(f"{len(reqs) - len(differ)} of {len(reqs)} answers identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
