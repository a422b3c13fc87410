#!/usr/bin/env python3
"""Multi-turn chats that share a long system prompt: the load prefix caching
is for.

    python3 scripts/prefix_chat.py --sessions 16 --turns 3 -c 4

Runs S sessions of T turns each, C sessions at a time. Every turn resends
the whole conversation (the system prompt of about --system-words words,
the same in every session, then the turns so far) to
/v1/chat/completions, streams --max-tokens tokens greedily and times the
first one. Prints one JSON line: time to first token (p50, p99) of first
turns and of later turns, the wall time, failures, and the cached prompt
tokens the server reported. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

# The same percentile rule as the load generator beside this script.
from loadgen import percentile

WORDS = (
    "rivers mountains engines gardens markets bridges winters oceans forests villages "
    "letters numbers mornings doctors teachers farmers stones papers windows music"
).split()


def system_prompt(words: int) -> str:
    rng = random.Random(7)
    notes = " ".join(rng.choice(WORDS) for _ in range(words))
    return (
        "You are a careful assistant for a small library. "
        "House rules and catalogue notes follow. " + notes
    )


def chat_turn(args, messages: list[dict]) -> tuple[float | None, str, dict | None]:
    """One streamed turn: time to its first text, its text, its usage."""
    body = {
        "model": args.model,
        "messages": messages,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        f"{args.base_url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    start = time.perf_counter()
    first, text, usage = None, [], None
    with urllib.request.urlopen(req, timeout=300) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if first is None:
                        first = time.perf_counter() - start
                    text.append(piece)
    return first, "".join(text), usage


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="default: first of /v1/models")
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("-c", "--concurrency", type=int, default=4)
    ap.add_argument("--system-words", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    if args.model is None:
        with urllib.request.urlopen(f"{args.base_url}/v1/models", timeout=30) as r:
            args.model = json.load(r)["data"][0]["id"]
    system = system_prompt(args.system_words)
    lock = threading.Lock()
    first_turns: list[float] = []
    later_turns: list[float] = []
    tally = {"cached": 0, "failed": 0}

    def session(s: int) -> None:
        messages = [{"role": "system", "content": system}]
        for t in range(args.turns):
            topic = WORDS[(s + t) % len(WORDS)]
            ask = f"Visitor {s} asks question {t}: which {topic} book should I read next?"
            messages.append({"role": "user", "content": ask})
            try:
                ttft, text, usage = chat_turn(args, messages)
            except Exception as e:  # a failed turn ends its session
                print("fail:", e)
                with lock:
                    tally["failed"] += 1
                return
            details = (usage or {}).get("prompt_tokens_details") or {}
            with lock:
                (first_turns if t == 0 else later_turns).append(
                    float("nan") if ttft is None else ttft
                )
                tally["cached"] += details.get("cached_tokens") or 0
            messages.append({"role": "assistant", "content": text})

    start = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(session, range(args.sessions)))
    wall = time.perf_counter() - start

    def ms(values: list[float], p: float) -> float | None:
        v = percentile(values, p)
        return None if v is None else round(1000 * v, 1)

    print(json.dumps({
        "label": args.label,
        "sessions": args.sessions,
        "turns": args.turns,
        "concurrency": args.concurrency,
        "wall_s": round(wall, 2),
        "failed": tally["failed"],
        "ttft_first_p50_ms": ms(first_turns, 50),
        "ttft_first_p99_ms": ms(first_turns, 99),
        "ttft_later_p50_ms": ms(later_turns, 50),
        "ttft_later_p99_ms": ms(later_turns, 99),
        "reported_cached_tokens": tally["cached"],
    }))


if __name__ == "__main__":
    main()
