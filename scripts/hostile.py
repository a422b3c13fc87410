"""Measures how a running wick server copes with hostile and heavy clients.

    pip install httpx
    python3 scripts/hostile.py [SCENARIO ...] [--only a,b] [options]

SCENARIO is any of soak, storm, idle, slow, abuse, fair, grammar, bulk,
store (or `--only soak,storm`); with none given, all run in that order.
Common options: `--base-url` (default http://127.0.0.1:8000), `--server-pid
PID` (RSS is read from /proc/PID/status VmRSS; without it RSS is reported
as null), `--seed`, and `--api-key KEY` (repeatable) for a server that
wants keys (bulk and store send it).
Each scenario prints a human summary and then ends with exactly one line of
JSON, `{"scenario": NAME, "ok": BOOL, ...}`, so `grep '^{'` collects results.
"ok" is whether the scenario saw what a healthy server should give; the exit
status is 0 when every scenario run was ok, 1 otherwise, 2 when the server
never became healthy. Failures are measurements, not crashes of this script.

soak  (-n/--requests 1500, -c/--concurrency 32)
    A random mix of /v1/completions and /v1/chat/completions, streamed (with
    stream_options.include_usage) or not, max_tokens 8-48, temperature 0 or
    0.8, about a third with stop ["."] or ["\\n"], about a fifth with n=2.
    Numbers:
      requests            requests sent
      ok                  requests with HTTP 200 and no failed check
      completed           HTTP 200 with the whole body read (ok or not)
      failures            requests per failure kind (a request may count
                          under several kinds):
        transport         connection error or timeout
        http_5xx/http_4xx any other status than 200
        bad_json          a body or SSE payload that is not JSON
        stream_error      an SSE payload carrying an "error" object
        no_done           the stream did not end with `data: [DONE]`
        missing_finish    a choice index with no chunk carrying a non-null
                          finish_reason (streams)
        duplicate_finish  a choice index with more than one such chunk
        bad_finish_reason a finish_reason outside {stop, length}
        wrong_choices     not exactly n choice indices
        missing_usage     a stream asked include_usage and got no usage
        bad_usage         usage.completion_tokens outside [1, max_tokens*n]
      duplicate_finish_streams  streams with a duplicated finish (same as
                          failures.duplicate_finish, given on its own)
      metrics_success_delta     change of wick:request_success_total summed
                          over all label sets (by_reason: per finished_reason)
      expected_success_requests completed requests: the delta should equal
                          this: wick counts each request once, whatever its
                          n (expected_success_choices, the per-choice count,
                          is reported for servers that count choices)
      client_finish_reasons     each choice's first finish_reason as the
                          client saw it, to set against by_reason
      rss_mib_before/after, wall_s, req_per_s, latency_s (p50/p99/max)

storm (-m/--clients 200)
    M clients open connections, then all at once send a streaming completion
    with max_tokens 256 and ignore_eos. Even-numbered clients close right
    after sending (before any byte arrives); odd ones close right after the
    first SSE event. Numbers:
      first_event_clients   how many of the second half saw an event, and the
                            max/median seconds they waited for it
      drain_s               seconds from the last disconnect until /metrics
                            shows num_requests_running == 0,
                            num_requests_waiting == 0 and kv_blocks_used == 0
                            (polled every 50 ms, null after 60 s; last_gauges
                            holds the last values seen)
      after_status/after_latency_s  a normal completion sent afterwards
      abort_delta           change of request_success_total{reason=abort}
      rss_mib_before/after

idle  (-k/--connections 2000, --idle-wait 40)
    The script first raises its RLIMIT_NOFILE soft limit to the hard limit.
    K raw TCP connections are opened that send nothing. While they are open,
    GET /health and a completion with max_tokens 4 go over fresh connections
    (a failure is non-200 or no answer within 10 s). After --idle-wait
    seconds it counts how many of the K sockets the server closed (a read
    gave b'' or an error). Numbers: opened, open_errors, probes (status and
    latency_s of each), closed_by_server, still_open, close_after_s (seconds
    from a socket's connect to its close: min/median/max).

slow  (-s/--slow-conns 50, --slow-interval 5, --slow-max-wait 90)
    Slowloris: S connections send `POST /v1/completions HTTP/1.1`, a Host
    header, then one byte of a never-ending header every interval; S more
    send complete headers with Content-Length: 1000 and then one body byte
    every interval. Each is watched until the server closes it (read gives
    b''/error, or a write fails) or max-wait passes. /health is probed over
    a fresh connection every 2 s meanwhile. Numbers per kind (head, body):
    closed, still_open, close_after_s (min/median/max), responses (the
    status lines the server sent before closing, counted); and health:
    probes, failures, max_latency_s.

abuse
    One request per known attack, each expected to be refused in OpenAI's
    error shape without harm: a $ref chain 300 and 1000 deep (response_format
    and a forced tool), an allOf nest 40 deep, a self-referencing $ref, a bad
    x-guidance whitespace_pattern, ^(.{1,100}){1,100}$, ^.*a.{60}$ with n=16,
    16 concurrent 8 MB /tokenize bodies, a foreign Host, two Host headers, a
    forged X-Request-Id (must come back sanitized), a gzip body. Numbers:
    cases (name -> status, ok, message head), rss_mib_before/after,
    health_after. A case is ok when its status is the expected one and no
    message carries "<state>".

fair
    Time to first token of 4-token streamed requests (--fair-probes of them)
    while one client's n=128, max_tokens=1000, ignore_eos request runs, and
    while an 8,000-token prompt with max_tokens 1 prefills. Numbers per
    phase: ttft_s (each probe), max; ok when every probe's TTFT is within
    --fair-max-ttft (2 s).

bulk
    The largest body the limit allows (--max-body-mib, 8) of each shape a
    client can repeat items in: tools (chat, Messages, Responses), stop
    strings, logit_bias keys, stop_token_ids, metadata keys, messages,
    content parts, tool_use blocks (Messages and count_tokens), Responses
    input items, and one prompt with n=128 and 64 stop strings of 127 KiB.
    Each is sent alone with a 4-token completion 50 ms behind it. Numbers
    per case: status, seconds, the small request's status and seconds,
    message head; rss_mib_before/after. ok when every case is answered
    (any status but 5xx) within --bulk-max-s (2 s) and so is its small
    request.

store
    What the Responses store holds and who may read it. --store-requests
    (8) responses are stored, each echoing 128 tools whose parameter
    schemas hold many small properties (about 6 MB of JSON each), after as
    many identical requests with store false (so that RSS counts what is
    kept, not the allocator's first growth); then
    --store-gets (16) concurrent GETs of one of them while /health is
    probed. With two --api-key values, the second key tries to read,
    continue and delete a response of the first. Numbers: stored,
    response_mib (one response's JSON), rss_mib_before/after and
    rss_growth_per_response_mib, get_s (slowest GET), health_max_s,
    cross_key (status of each attempt). ok when every GET returned the
    stored bytes, /health stayed under 1 s, RSS grew less than 3x the JSON
    kept, and every cross-key attempt got 404.

grammar
    Latency of --grammar-plain plain 16-token chats, sent at once: alone,
    beside as many unconstrained 64-token chats, and beside as many 64-token
    chats under the regex ^.*a.{60}$ (about 1 ms of mask a token, against
    microseconds for a JSON schema). Numbers: p50/max latency per phase,
    slowdown (p50 beside the grammar over p50 beside unconstrained chats),
    grammar_status (status counts of the constrained chats), mask_deferrals
    (wick:grammar_mask_deferrals_total during that phase). ok when every
    plain chat succeeds, the constrained ones end in 200 or a clean 400, and
    slowdown is within --grammar-max-slowdown (1.35).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import resource
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

SCENARIOS = ("soak", "storm", "idle", "slow", "abuse", "fair", "grammar", "bulk", "store")

# ----------------------------------------------------------------------------
# shared helpers
# ----------------------------------------------------------------------------

_SAMPLE_RE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{(?P<labels>.*)\})?"
    r"\s+(?P<value>\S+)(?:\s+-?\d+)?\s*$"
)
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text format -> {name: [(labels, value), ...]}."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        labels = dict(_LABEL_RE.findall(m["labels"] or ""))
        out.setdefault(m["name"], []).append((labels, value))
    return out


def metric_sum(metrics: dict, name: str, **match: str) -> float | None:
    """Sum of every series of `name` whose labels include `match`; None when
    the metric is absent."""
    series = metrics.get(name)
    if series is None:
        return None
    return sum(v for labels, v in series if all(labels.get(k) == x for k, x in match.items()))


def metric_by_label(metrics: dict, name: str, label: str) -> dict[str, float]:
    acc: Counter = Counter()
    for labels, v in metrics.get(name, []):
        acc[labels.get(label, "")] += v
    return dict(acc)


async def fetch_metrics(client: httpx.AsyncClient) -> dict:
    r = await client.get("/metrics", timeout=10)
    r.raise_for_status()
    return parse_metrics(r.text)


def read_rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def stats(xs: list[float]) -> dict[str, float] | None:
    """min/median/p99/max of a list, rounded; None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    p99 = s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)]
    return {
        "min": round(s[0], 3),
        "p50": round(statistics.median(s), 3),
        "p99": round(p99, 3),
        "max": round(s[-1], 3),
    }


def host_port(base_url: str) -> tuple[str, int]:
    u = urlsplit(base_url)
    if u.scheme != "http":
        raise SystemExit("raw-socket scenarios need an http:// base URL")
    return u.hostname or "127.0.0.1", u.port or 80


def raise_nofile_limit() -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


async def probe(base_url: str, method: str, path: str, body: Any = None,
                timeout: float = 10.0) -> dict[str, Any]:
    """One request over a fresh connection: status, latency, error."""
    t0 = time.monotonic()
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=timeout) as c:
            r = await c.request(method, path, json=body)
            status, error = r.status_code, None
    except Exception as e:  # noqa: BLE001 - every failure is a measurement
        status, error = None, type(e).__name__
    latency = time.monotonic() - t0
    return {
        "path": path,
        "status": status,
        "latency_s": round(latency, 3),
        "error": error,
        "ok": status == 200 and latency <= timeout,
    }


SMALL_COMPLETION = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}


def emit(result: dict[str, Any], lines: list[str]) -> None:
    print(f"== {result['scenario']} ==")
    for line in lines:
        print("  " + line)
    print(json.dumps(result), flush=True)


async def close_writer(w: asyncio.StreamWriter) -> None:
    w.close()
    try:
        await asyncio.wait_for(w.wait_closed(), 2)
    except Exception:  # noqa: BLE001
        pass


# ----------------------------------------------------------------------------
# soak
# ----------------------------------------------------------------------------

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "List three colours. 1.",
    "def fibonacci(n):\n",
    "Water boils at",
    "The quick brown fox",
    "In 1969, the first humans",
    "My favourite recipe is",
]
CHAT_PROMPTS = [
    "Name three planets.",
    "Tell me a joke.",
    "What is 2 + 2?",
    "Write one sentence about the sea.",
    "Say hello in French.",
    "Give me a word that rhymes with cat.",
]
FINISH_OK = {"stop", "length"}


@dataclass
class SoakSpec:
    chat: bool
    stream: bool
    max_tokens: int
    n: int
    body: dict[str, Any]

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.chat else "/v1/completions"


def soak_spec(rng: random.Random) -> SoakSpec:
    chat = rng.random() < 0.5
    stream = rng.random() < 0.5
    max_tokens = rng.randint(8, 48)
    n = 2 if rng.random() < 0.2 else 1
    body: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": rng.choice([0.0, 0.8]),
        "n": n,
    }
    if chat:
        body["messages"] = [{"role": "user", "content": rng.choice(CHAT_PROMPTS)}]
    else:
        body["prompt"] = rng.choice(PROMPTS)
    if rng.random() < 1 / 3:
        body["stop"] = [rng.choice([".", "\n"])]
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return SoakSpec(chat, stream, max_tokens, n, body)


def check_usage(usage: Any, spec: SoakSpec, problems: set[str]) -> None:
    ct = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(ct, int) or not 1 <= ct <= spec.max_tokens * spec.n:
        problems.add("bad_usage")


async def soak_one(client: httpx.AsyncClient, spec: SoakSpec, reasons: Counter,
                   ) -> tuple[set[str], bool, float]:
    """Sends one request; returns (failure kinds, completed, latency) and
    adds each choice's (first) finish_reason to `reasons`."""
    problems: set[str] = set()
    completed = False
    t0 = time.monotonic()
    try:
        if spec.stream:
            async with client.stream("POST", spec.path, json=spec.body) as r:
                if r.status_code != 200:
                    await r.aread()
                    problems.add("http_5xx" if r.status_code >= 500 else "http_4xx")
                else:
                    payloads = [
                        line[5:].strip()
                        async for line in r.aiter_lines()
                        if line.startswith("data:")
                    ]
                    completed = True
                    check_stream(payloads, spec, problems, reasons)
        else:
            r = await client.post(spec.path, json=spec.body)
            if r.status_code != 200:
                problems.add("http_5xx" if r.status_code >= 500 else "http_4xx")
            else:
                completed = True
                check_plain(r.content, spec, problems, reasons)
    except Exception:  # noqa: BLE001 - connection errors, timeouts, protocol errors
        problems.add("transport")
        completed = False
    return problems, completed, time.monotonic() - t0


def check_stream(payloads: list[str], spec: SoakSpec, problems: set[str],
                 reasons: Counter) -> None:
    if not payloads or payloads[-1] != "[DONE]":
        problems.add("no_done")
    finishes: Counter = Counter()
    seen: set[int] = set()
    usage = None
    for p in payloads:
        if p == "[DONE]":
            continue
        try:
            obj = json.loads(p)
        except ValueError:
            problems.add("bad_json")
            continue
        if "error" in obj:
            problems.add("stream_error")
            continue
        if obj.get("usage"):
            usage = obj["usage"]
        for ch in obj.get("choices") or []:
            idx = ch.get("index")
            seen.add(idx)
            fr = ch.get("finish_reason")
            if fr is not None:
                if finishes[idx] == 0:
                    reasons[fr] += 1
                finishes[idx] += 1
                if fr not in FINISH_OK:
                    problems.add("bad_finish_reason")
    if seen != set(range(spec.n)):
        problems.add("wrong_choices")
    for i in range(spec.n):
        if finishes[i] == 0:
            problems.add("missing_finish")
        elif finishes[i] > 1:
            problems.add("duplicate_finish")
    if usage is None:
        problems.add("missing_usage")
    else:
        check_usage(usage, spec, problems)


def check_plain(content: bytes, spec: SoakSpec, problems: set[str],
                reasons: Counter) -> None:
    try:
        obj = json.loads(content)
    except ValueError:
        problems.add("bad_json")
        return
    choices = obj.get("choices") or []
    if sorted(c.get("index") for c in choices) != list(range(spec.n)):
        problems.add("wrong_choices")
    for c in choices:
        reasons[str(c.get("finish_reason"))] += 1
        if c.get("finish_reason") not in FINISH_OK:
            problems.add("bad_finish_reason")
    if obj.get("usage") is not None:
        check_usage(obj["usage"], spec, problems)


async def wait_idle(client: httpx.AsyncClient, timeout: float) -> dict | None:
    """Polls /metrics until nothing runs or waits; returns the last parse."""
    deadline = time.monotonic() + timeout
    m = None
    while True:
        try:
            m = await fetch_metrics(client)
            if (metric_sum(m, "wick:num_requests_running") or 0) == 0 and (
                metric_sum(m, "wick:num_requests_waiting") or 0
            ) == 0:
                return m
        except Exception:  # noqa: BLE001
            pass
        if time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.05)


async def scenario_soak(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    specs = [soak_spec(rng) for _ in range(args.requests)]
    limits = httpx.Limits(max_connections=args.concurrency + 4,
                          max_keepalive_connections=args.concurrency + 4)
    async with httpx.AsyncClient(base_url=args.base_url, limits=limits,
                                 timeout=args.request_timeout) as client:
        rss_before = read_rss_mib(args.server_pid)
        m_before = await fetch_metrics(client)
        queue: asyncio.Queue[SoakSpec] = asyncio.Queue()
        for s in specs:
            queue.put_nowait(s)
        failures: Counter = Counter()
        reasons: Counter = Counter()
        latencies: list[float] = []
        ok = completed = choices_completed = 0

        async def worker() -> None:
            nonlocal ok, completed, choices_completed
            while True:
                try:
                    spec = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                problems, done, lat = await soak_one(client, spec, reasons)
                latencies.append(lat)
                failures.update(problems)
                completed += done
                choices_completed += spec.n if done else 0
                ok += done and not problems

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        wall = time.monotonic() - t0
        m_after = await wait_idle(client, 5) or await fetch_metrics(client)
        rss_after = read_rss_mib(args.server_pid)

    name = "wick:request_success_total"
    before, after = metric_sum(m_before, name), metric_sum(m_after, name)
    delta = None if before is None or after is None else after - before
    rb, ra = metric_by_label(m_before, name, "finished_reason"), metric_by_label(
        m_after, name, "finished_reason")
    by_reason = {k: ra.get(k, 0) - rb.get(k, 0) for k in sorted(set(ra) | set(rb))}
    metrics_match = delta is not None and delta == completed
    mix = Counter(
        ("chat" if s.chat else "cmpl") + ("/stream" if s.stream else "") for s in specs
    )
    result = {
        "scenario": "soak",
        "ok": ok == len(specs) and metrics_match,
        "requests": len(specs),
        "concurrency": args.concurrency,
        "ok_requests": ok,
        "completed": completed,
        "failures": dict(sorted(failures.items())),
        "duplicate_finish_streams": failures.get("duplicate_finish", 0),
        "mix": dict(sorted(mix.items())),
        "with_stop": sum("stop" in s.body for s in specs),
        "with_n2": sum(s.n == 2 for s in specs),
        "metrics_success_delta": delta,
        "metrics_success_by_reason": by_reason,
        "expected_success_requests": completed,
        "expected_success_choices": choices_completed,
        "metrics_match": metrics_match,
        "client_finish_reasons": dict(sorted(reasons.items())),
        "rss_mib_before": rss_before,
        "rss_mib_after": rss_after,
        "wall_s": round(wall, 2),
        "req_per_s": round(len(specs) / wall, 2) if wall else None,
        "latency_s": stats(latencies),
    }
    lines = [
        f"{len(specs)} requests at concurrency {args.concurrency} in {wall:.1f} s "
        f"({result['req_per_s']} req/s); mix {result['mix']}, "
        f"{result['with_stop']} with stop, {result['with_n2']} with n=2",
        f"ok {ok}, completed {completed}, failures {result['failures'] or 'none'}",
        f"duplicate-finish streams: {result['duplicate_finish_streams']}",
        f"request_success_total delta {delta} {by_reason} vs {completed} completed "
        f"requests / {choices_completed} choices -> "
        f"{'match' if metrics_match else 'MISMATCH'}; clients saw {dict(sorted(reasons.items()))}",
        f"RSS {rss_before} -> {rss_after} MiB; latency {result['latency_s']}",
    ]
    emit(result, lines)
    return result


# ----------------------------------------------------------------------------
# storm
# ----------------------------------------------------------------------------


def raw_request(host: str, port: int, path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


async def read_first_event(reader: asyncio.StreamReader) -> int | None:
    """Reads a response head and its body up to the first complete SSE event;
    returns the HTTP status (None if the head never came). Handles chunked
    transfer encoding."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        return None
    headers = {
        k.strip().lower(): v.strip()
        for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)
    }
    if status != 200:
        return status
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    body = b""
    while b"\n\n" not in body and b"\r\n\r\n" not in body:
        if chunked:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                break
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        else:
            more = await reader.read(4096)
            if not more:
                break
            body += more
    return status


async def scenario_storm(args: argparse.Namespace) -> dict[str, Any]:
    host, port = host_port(args.base_url)
    body = {
        "prompt": "Write a long story about a lighthouse keeper.",
        "max_tokens": 256,
        "ignore_eos": True,
        "temperature": 0.8,
        "stream": True,
    }
    request = raw_request(host, port, "/v1/completions", body)
    async with httpx.AsyncClient(base_url=args.base_url, timeout=10) as client:
        rss_before = read_rss_mib(args.server_pid)
        m_before = await fetch_metrics(client)

        conns = await asyncio.gather(
            *(asyncio.open_connection(host, port) for _ in range(args.clients)),
            return_exceptions=True,
        )
        open_errors = Counter(type(c).__name__ for c in conns if isinstance(c, BaseException))
        live = [c for c in conns if not isinstance(c, BaseException)]
        close_times: list[float] = []
        first_waits: list[float] = []
        first_status: Counter = Counter()
        send_errors = 0

        async def client_task(i: int, reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> None:
            nonlocal send_errors
            t0 = time.monotonic()
            try:
                writer.write(request)
                await writer.drain()
            except OSError:
                send_errors += 1
            if i % 2 == 1:
                try:
                    st = await asyncio.wait_for(read_first_event(reader), args.first_event_timeout)
                    first_status[str(st)] += 1
                    if st == 200:
                        first_waits.append(time.monotonic() - t0)
                except Exception as e:  # noqa: BLE001
                    first_status[type(e).__name__] += 1
            await close_writer(writer)
            close_times.append(time.monotonic())

        t_start = time.monotonic()
        await asyncio.gather(*(client_task(i, r, w) for i, (r, w) in enumerate(live)))
        last_disconnect = max(close_times) if close_times else time.monotonic()

        # drain: poll every 50 ms until nothing runs, waits or holds KV blocks
        drain = None
        gauges: dict[str, float | None] = {}
        while time.monotonic() - last_disconnect < args.drain_timeout:
            try:
                m = await fetch_metrics(client)
                gauges = {
                    k: metric_sum(m, f"wick:{k}")
                    for k in ("num_requests_running", "num_requests_waiting", "kv_blocks_used")
                }
                if all(v == 0 for v in gauges.values()):
                    drain = time.monotonic() - last_disconnect
                    break
            except Exception:  # noqa: BLE001
                pass
            await asyncio.sleep(0.05)
        rss_after = read_rss_mib(args.server_pid)
        after = await probe(args.base_url, "POST", "/v1/completions", SMALL_COMPLETION,
                            timeout=args.request_timeout)
        m_after = await fetch_metrics(client)

    name = "wick:request_success_total"
    abort_delta = (metric_sum(m_after, name, finished_reason="abort") or 0) - (
        metric_sum(m_before, name, finished_reason="abort") or 0)
    half = sum(1 for i in range(len(live)) if i % 2 == 1)
    result = {
        "scenario": "storm",
        "ok": drain is not None and after["ok"] and not open_errors,
        "clients": args.clients,
        "connected": len(live),
        "open_errors": dict(open_errors),
        "send_errors": send_errors,
        "closed_before_reply": len(live) - half,
        "closed_after_first_event": half,
        "first_event_status": dict(first_status),
        "first_event_wait_s": stats(first_waits),
        "storm_s": round(last_disconnect - t_start, 3),
        "drain_s": None if drain is None else round(drain, 3),
        "drain_timeout_s": args.drain_timeout,
        "last_gauges": gauges,
        "abort_delta": abort_delta,
        "after_status": after["status"],
        "after_latency_s": after["latency_s"],
        "after_error": after["error"],
        "rss_mib_before": rss_before,
        "rss_mib_after": rss_after,
    }
    lines = [
        f"{len(live)}/{args.clients} clients connected; {len(live) - half} closed right "
        f"after sending, {half} after the first event (status {dict(first_status)}, "
        f"wait {result['first_event_wait_s']})",
        f"last disconnect {result['storm_s']} s after the start; drain "
        + (f"{result['drain_s']} s" if drain is not None
           else f"NOT reached within {args.drain_timeout} s (last {gauges})"),
        f"aborts counted by /metrics: {abort_delta}",
        f"completion afterwards: status {after['status']} in {after['latency_s']} s"
        + (f" ({after['error']})" if after["error"] else ""),
        f"RSS {rss_before} -> {rss_after} MiB",
    ]
    emit(result, lines)
    return result


# ----------------------------------------------------------------------------
# idle
# ----------------------------------------------------------------------------


@dataclass
class Watched:
    """A raw connection whose closing by the server is being watched."""
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    opened: float
    closed: float | None = None
    received: bytes = b""
    task: asyncio.Task | None = field(default=None, repr=False)

    def watch(self) -> None:
        self.task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                if len(self.received) < 256:
                    self.received += data[: 256 - len(self.received)]
        except Exception:  # noqa: BLE001 - reset counts as closed
            pass
        self.closed = time.monotonic()

    def status_line(self) -> str | None:
        if not self.received:
            return None
        return self.received.split(b"\r\n", 1)[0].decode("latin-1")[:60]

    async def close(self) -> None:
        if self.task:
            self.task.cancel()
        await close_writer(self.writer)


async def open_watched(host: str, port: int, count: int, parallel: int = 256,
                       ) -> tuple[list[Watched], Counter]:
    sem = asyncio.Semaphore(parallel)
    errors: Counter = Counter()

    async def one() -> Watched | None:
        async with sem:
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
            except Exception as e:  # noqa: BLE001
                errors[type(e).__name__] += 1
                return None
            c = Watched(r, w, time.monotonic())
            c.watch()
            return c

    conns = [c for c in await asyncio.gather(*(one() for _ in range(count))) if c]
    return conns, errors


async def scenario_idle(args: argparse.Namespace) -> dict[str, Any]:
    host, port = host_port(args.base_url)
    soft, hard = raise_nofile_limit()
    rss_before = read_rss_mib(args.server_pid)
    t0 = time.monotonic()
    conns, open_errors = await open_watched(host, port, args.connections)
    open_s = time.monotonic() - t0
    probes = [
        await probe(args.base_url, "GET", "/health"),
        await probe(args.base_url, "POST", "/v1/completions", SMALL_COMPLETION),
    ]
    closed_early = sum(c.closed is not None for c in conns)
    await asyncio.sleep(args.idle_wait)
    closed = [c for c in conns if c.closed is not None]
    rss_after = read_rss_mib(args.server_pid)
    close_after = [c.closed - c.opened for c in closed]
    responses = Counter(c.status_line() for c in closed if c.status_line())
    await asyncio.gather(*(c.close() for c in conns))

    result = {
        "scenario": "idle",
        "ok": all(p["ok"] for p in probes) and len(closed) == len(conns) and not open_errors,
        "connections": args.connections,
        "nofile_limit": [soft, hard],
        "opened": len(conns),
        "open_errors": dict(open_errors),
        "open_s": round(open_s, 3),
        "probes": probes,
        "closed_during_probes": closed_early,
        "idle_wait_s": args.idle_wait,
        "closed_by_server": len(closed),
        "still_open": len(conns) - len(closed),
        "close_after_s": stats(close_after),
        "responses": dict(responses),
        "rss_mib_before": rss_before,
        "rss_mib_after": rss_after,
    }
    lines = [
        f"opened {len(conns)}/{args.connections} idle connections in {open_s:.2f} s "
        f"(NOFILE {soft}/{hard}; errors {dict(open_errors) or 'none'})",
        *(f"{p['path']}: status {p['status']} in {p['latency_s']} s"
          + (f" ({p['error']})" if p["error"] else "") + ("" if p["ok"] else "  FAILED")
          for p in probes),
        f"after {args.idle_wait} s: server closed {len(closed)}, {len(conns) - len(closed)} "
        f"still open; close after {result['close_after_s']}; responses {dict(responses) or 'none'}",
        f"RSS {rss_before} -> {rss_after} MiB",
    ]
    emit(result, lines)
    return result


# ----------------------------------------------------------------------------
# slow
# ----------------------------------------------------------------------------


def _trickle(prefix: bytes, filler: bytes):
    yield from prefix
    while True:
        yield from filler


async def slow_conn(host: str, port: int, kind: str, interval: float,
                    max_wait: float) -> dict[str, Any]:
    """One slowloris connection; returns when the server closed it or
    max_wait passed."""
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
    except Exception as e:  # noqa: BLE001
        return {"kind": kind, "open_error": type(e).__name__}
    c = Watched(r, w, time.monotonic())
    c.watch()
    if kind == "head":
        first = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n".encode()
        trickle = _trickle(b"X-Slowloris: ", b"a")
    else:
        first = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n"
                 "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n").encode()
        trickle = _trickle(b'{"prompt": "', b"a")
    write_error = None
    deadline = c.opened + max_wait
    try:
        w.write(first)
        await w.drain()
        while c.closed is None and time.monotonic() < deadline:
            await asyncio.wait([c.task], timeout=min(interval, max(0, deadline - time.monotonic())))
            if c.closed is not None or time.monotonic() >= deadline:
                break
            w.write(bytes([next(trickle)]))
            await w.drain()
    except OSError as e:
        write_error = type(e).__name__
        if c.closed is None:
            await asyncio.wait([c.task], timeout=1)
            if c.closed is None:
                c.closed = time.monotonic()
    out = {
        "kind": kind,
        "closed_after": None if c.closed is None else c.closed - c.opened,
        "status_line": c.status_line(),
        "write_error": write_error,
    }
    await c.close()
    return out


async def scenario_slow(args: argparse.Namespace) -> dict[str, Any]:
    host, port = host_port(args.base_url)
    raise_nofile_limit()
    rss_before = read_rss_mib(args.server_pid)
    tasks = [
        asyncio.create_task(slow_conn(host, port, kind, args.slow_interval, args.slow_max_wait))
        for kind in ("head", "body") for _ in range(args.slow_conns)
    ]
    health: list[dict[str, Any]] = []
    while not all(t.done() for t in tasks):
        health.append(await probe(args.base_url, "GET", "/health"))
        await asyncio.wait(tasks, timeout=2)
    outs = [t.result() for t in tasks]
    rss_after = read_rss_mib(args.server_pid)

    kinds: dict[str, Any] = {}
    for kind in ("head", "body"):
        mine = [o for o in outs if o["kind"] == kind]
        times = [o["closed_after"] for o in mine if o.get("closed_after") is not None]
        kinds[kind] = {
            "connections": len(mine),
            "open_errors": sum("open_error" in o for o in mine),
            "closed": len(times),
            "still_open": len(mine) - len(times) - sum("open_error" in o for o in mine),
            "close_after_s": stats(times),
            "responses": dict(Counter(o["status_line"] for o in mine if o.get("status_line"))),
            "write_errors": sum(bool(o.get("write_error")) for o in mine),
        }
    health_fail = [h for h in health if not h["ok"]]
    result = {
        "scenario": "slow",
        "ok": not health_fail and all(k["still_open"] == 0 for k in kinds.values()),
        "per_kind": args.slow_conns,
        "interval_s": args.slow_interval,
        "max_wait_s": args.slow_max_wait,
        **kinds,
        "health": {
            "probes": len(health),
            "failures": len(health_fail),
            "max_latency_s": max((h["latency_s"] for h in health), default=None),
            "statuses": dict(Counter(str(h["status"] or h["error"]) for h in health)),
        },
        "rss_mib_before": rss_before,
        "rss_mib_after": rss_after,
    }
    lines = [
        f"{args.slow_conns} connections of each kind, one byte every {args.slow_interval} s, "
        f"watched up to {args.slow_max_wait} s",
        *(f"{k:4s}: closed {v['closed']}/{v['connections']} (still open {v['still_open']}), "
          f"close after {v['close_after_s']}, responses {v['responses'] or 'none'}"
          for k, v in kinds.items()),
        f"/health meanwhile: {len(health)} probes, {len(health_fail)} failed, "
        f"max latency {result['health']['max_latency_s']} s",
        f"RSS {rss_before} -> {rss_after} MiB",
    ]
    emit(result, lines)
    return result


# ----------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------



# ----------------------------------------------------------------------------
# abuse: known attacks, one request each
# ----------------------------------------------------------------------------

def ref_chain(n: int, kw: str = "items") -> dict[str, Any]:
    defs: dict[str, Any] = {f"d{i}": {"type": "array", kw: {"$ref": f"#/$defs/d{i + 1}"}}
                            for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def chat_with(schema: Any = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 8}
    if schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "x", "schema": schema}}
    body.update(extra)
    return body


async def raw_status(host: str, port: int, head: str, body: bytes = b"") -> tuple[int | None, bytes]:
    """Sends a raw request; the status and body of the answer."""
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
        w.write(head.encode() + b"\r\n" + body)
        await w.drain()
        data = await asyncio.wait_for(r.read(), 30)
        await close_writer(w)
    except Exception:  # noqa: BLE001 - a measurement
        return None, b""
    parts = data.split(b" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    return status, data.split(b"\r\n\r\n", 1)[-1]


async def scenario_abuse(args: argparse.Namespace) -> dict[str, Any]:
    host, port = host_port(args.base_url)
    rss_before = read_rss_mib(args.server_pid)
    deep = {"type": "string"}
    for _ in range(40):
        deep = {"allOf": [deep]}
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": ref_chain(1000)}}}}
    posts: list[tuple[str, str, Any, int]] = [
        ("ref_chain_300", "/v1/chat/completions", chat_with(ref_chain(300)), 400),
        ("ref_chain_1000", "/v1/chat/completions", chat_with(ref_chain(1000)), 400),
        ("tool_ref_chain_1000", "/v1/chat/completions", chat_with(
            tools=[tool], tool_choice={"type": "function", "function": {"name": "f"}}), 400),
        ("allof_40", "/v1/chat/completions", chat_with(deep), 400),
        ("self_ref", "/v1/chat/completions",
         chat_with({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}), 400),
        ("bad_whitespace_pattern", "/v1/chat/completions",
         chat_with({"type": "object", "x-guidance": {"whitespace_pattern": "("}}), 400),
        ("nested_repeat_pattern", "/v1/chat/completions",
         chat_with({"type": "string", "pattern": "^(.{1,100}){1,100}$"}), 400),
        ("a60_n16", "/v1/chat/completions",
         chat_with({"type": "string", "pattern": "^.*a.{60}$"}, n=16, max_tokens=40), 200),
    ]
    cases: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=args.base_url, timeout=args.request_timeout) as c:
        for name, path, body, want in posts:
            r = await c.post(path, json=body)
            msg = r.json().get("error", {}).get("message", "") if r.status_code != 200 else ""
            # n=16 of ^.*a.{60}$ may run, or exhaust the lexer: a 400 either way.
            ok = (r.status_code == want or (want == 200 and r.status_code == 400)) \
                and "<state>" not in msg
            cases[name] = {"status": r.status_code, "ok": ok, "message": msg[:120]}
        text = "hello world " * ((8 << 20) // 12 - 64)
        rs = await asyncio.gather(*(c.post("/tokenize", json={"prompt": text}) for _ in range(16)))
        cases["tokenize_16x8MB"] = {"status": sorted({r.status_code for r in rs}),
                                    "ok": all(r.status_code == 400 for r in rs)}
        forged = "abc status=200 path=/admin/secret method=DELETE"
        r = await c.post("/v1/completions", json=SMALL_COMPLETION,
                         headers={"x-request-id": forged})
        rid = r.json().get("id", "")
        cases["forged_request_id"] = {"status": r.status_code, "id": rid,
                                      "ok": r.status_code == 200 and " " not in rid and "=" not in rid}
    status, _ = await raw_status(host, port, "GET /v1/models HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n")
    cases["foreign_host"] = {"status": status, "ok": status in (403, 421)}
    status, _ = await raw_status(host, port, f"GET /v1/models HTTP/1.1\r\nHost: {host}:{port}\r\nHost: evil.example\r\nConnection: close\r\n")
    cases["duplicate_host"] = {"status": status, "ok": status == 400}
    gz = bytes([0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3])
    status, _ = await raw_status(host, port, (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-encoding: gzip\r\ncontent-length: {len(gz)}\r\nConnection: close\r\n"), gz)
    cases["gzip_body"] = {"status": status, "ok": status == 415}
    health = await probe(args.base_url, "GET", "/health")
    result = {"scenario": "abuse", "cases": cases, "rss_mib_before": rss_before,
              "rss_mib_after": read_rss_mib(args.server_pid), "health_after": health,
              "ok": health["ok"] and all(c["ok"] for c in cases.values())}
    lines = [f"{k}: {v['status']} {'ok' if v['ok'] else 'FAILED'}" for k, v in cases.items()]
    emit(result, lines + [f"health after: {health['status']}"])
    return result


# ----------------------------------------------------------------------------
# fair: a small request's first token while one client holds the server
# ----------------------------------------------------------------------------

async def first_token_s(client: httpx.AsyncClient) -> float | None:
    t0 = time.monotonic()
    body = {"prompt": "Hi there friend", "max_tokens": 4, "stream": True}
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    return round(time.monotonic() - t0, 3)
    except httpx.HTTPError:
        return None
    return None


async def scenario_fair(args: argparse.Namespace) -> dict[str, Any]:
    long = [1000 + i % 20000 for i in range(8000)]
    hogs = {
        "n128_max_tokens_1000": {"prompt": "Once upon a time", "n": 128,
                                 "max_tokens": 1000, "ignore_eos": True},
        "prefill_8000_tokens": {"prompt": long, "max_tokens": 1},
    }
    phases: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=args.base_url, timeout=args.request_timeout) as c:
        for name, body in hogs.items():
            hog = asyncio.create_task(c.post("/v1/completions", json=body))
            while (metric_sum(await fetch_metrics(c), "wick:num_requests_running") or 0) < 1:
                await asyncio.sleep(0.05)
            ttfts = []
            for _ in range(args.fair_probes):
                if hog.done():
                    break
                ttfts.append(await first_token_s(c))
            hog.cancel()
            worst = max((t for t in ttfts if t is not None), default=None)
            phases[name] = {"ttft_s": ttfts, "max": worst,
                            "ok": bool(ttfts) and None not in ttfts
                            and worst is not None and worst <= args.fair_max_ttft}
            await wait_idle(c, 60)
    result = {"scenario": "fair", "phases": phases, "ok": all(p["ok"] for p in phases.values())}
    emit(result, [f"{k}: TTFT {v['ttft_s']} (max {v['max']})" for k, v in phases.items()])
    return result


# ----------------------------------------------------------------------------
# grammar: an expensive grammar's neighbours
# ----------------------------------------------------------------------------

async def timed_chat(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[int | None, float]:
    t0 = time.monotonic()
    try:
        r = await client.post("/v1/chat/completions", json=body)
        status = r.status_code
    except httpx.HTTPError:
        status = None
    return status, time.monotonic() - t0


async def scenario_grammar(args: argparse.Namespace) -> dict[str, Any]:
    n = args.grammar_plain
    plain = chat_with(max_tokens=16, ignore_eos=True)
    free = chat_with(max_tokens=64, ignore_eos=True)
    costly = chat_with({"type": "string", "pattern": "^.*a.{60}$"}, max_tokens=64)
    phases: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=args.base_url, timeout=args.request_timeout) as c:
        for name, neighbour in (("alone", None), ("beside_unconstrained", free),
                                ("beside_grammar", costly)):
            before = metric_sum(await fetch_metrics(c), "wick:grammar_mask_deferrals_total") or 0
            others = [asyncio.create_task(timed_chat(c, neighbour))
                      for _ in range(n if neighbour else 0)]
            await asyncio.sleep(0.5 if neighbour else 0)
            mine = await asyncio.gather(*(timed_chat(c, plain) for _ in range(n)))
            theirs = await asyncio.gather(*others)
            after = metric_sum(await fetch_metrics(c), "wick:grammar_mask_deferrals_total") or 0
            lat = sorted(t for _, t in mine)
            phases[name] = {
                "p50_s": round(lat[len(lat) // 2], 3), "max_s": round(lat[-1], 3),
                "plain_ok": all(s == 200 for s, _ in mine),
                "neighbour_status": dict(Counter(str(s) for s, _ in theirs)),
                "mask_deferrals": after - before,
            }
            await wait_idle(c, 60)
    slowdown = round(phases["beside_grammar"]["p50_s"] / phases["beside_unconstrained"]["p50_s"], 3)
    grammar_clean = set(phases["beside_grammar"]["neighbour_status"]) <= {"200", "400"}
    ok = all(p["plain_ok"] for p in phases.values()) and grammar_clean \
        and slowdown <= args.grammar_max_slowdown
    result = {"scenario": "grammar", "phases": phases, "slowdown": slowdown, "ok": ok}
    emit(result, [f"{k}: p50 {v['p50_s']} s, max {v['max_s']} s, neighbours "
                  f"{v['neighbour_status']}, mask deferrals {v['mask_deferrals']}"
                  for k, v in phases.items()] + [f"slowdown beside the grammar: {slowdown}"])
    return result


# ----------------------------------------------------------------------------
# bulk: the body limit's worth of one repeated item
# ----------------------------------------------------------------------------

def auth(args: argparse.Namespace, which: int = 0) -> dict[str, str]:
    keys = args.api_key or []
    return {"authorization": f"Bearer {keys[which]}"} if len(keys) > which else {}


def bulk_cases(limit: int) -> dict[str, tuple[str, dict[str, Any]]]:
    def fill(make: Any) -> list[Any]:
        each = len(json.dumps(make(999999))) + 2
        return [make(i) for i in range((limit - 4096) // each)]

    user = [{"role": "user", "content": "hi"}]
    tool_uses = lambda: fill(lambda i: {"type": "tool_use", "id": f"t{i}", "name": "f", "input": {}})  # noqa: E731
    tool_results = lambda: fill(lambda i: {"type": "tool_result", "tool_use_id": f"t{i}", "content": "r"})  # noqa: E731
    calls = fill(lambda i: {"id": f"c{i}", "type": "function",
                            "function": {"name": "f", "arguments": "{}"}})[: 60000]
    metadata = {f"k{i}": "v" for i in range(limit // 17)}
    return {
        "chat_tools": ("/v1/chat/completions", {"messages": user, "max_tokens": 4, "tools": fill(
            lambda i: {"type": "function", "function": {"name": f"f{i}"}})}),
        "chat_stop": ("/v1/chat/completions", {"messages": user, "max_tokens": 4,
                                               "stop": fill(lambda i: f"s{i}")}),
        "chat_logit_bias": ("/v1/chat/completions", {"messages": user, "max_tokens": 4, "logit_bias": {
            "0" * (i // 40000) + str(i % 40000): 1 for i in range(limit // 19)}}),
        "chat_stop_token_ids": ("/v1/chat/completions", {"messages": user, "max_tokens": 4,
                                                         "stop_token_ids": [i % 1000 for i in range(limit // 5 - 1000)]}),
        "chat_metadata": ("/v1/chat/completions", {"messages": user, "max_tokens": 4, "metadata": metadata}),
        "chat_messages": ("/v1/chat/completions", {"max_tokens": 4, "messages": fill(
            lambda i: {"role": "user", "content": "x"})}),
        "chat_parts": ("/v1/chat/completions", {"max_tokens": 4, "messages": [{"role": "user", "content": fill(
            lambda i: {"type": "text", "text": "x"})}]}),
        "chat_tool_results": ("/v1/chat/completions", {"max_tokens": 4, "messages": user + [
            {"role": "assistant", "tool_calls": calls}] + [
            {"role": "tool", "tool_call_id": f"c{i}", "content": "r"} for i in range(len(calls))]}),
        "messages_tools": ("/v1/messages", {"messages": user, "max_tokens": 4, "tools": fill(
            lambda i: {"name": f"f{i}", "input_schema": {"type": "object"}})}),
        "messages_tool_use": ("/v1/messages", {"max_tokens": 4, "messages": user + [
            {"role": "assistant", "content": tool_uses()[: 60000]},
            {"role": "user", "content": tool_results()[: 60000]}]}),
        "count_tokens_tool_use": ("/v1/messages/count_tokens", {"messages": user + [
            {"role": "assistant", "content": tool_uses()}, {"role": "user", "content": "ok"}]}),
        "messages_stop": ("/v1/messages", {"messages": user, "max_tokens": 4,
                                           "stop_sequences": fill(lambda i: f"s{i}")}),
        "responses_tools": ("/v1/responses", {"input": "hi", "max_output_tokens": 4, "tools": fill(
            lambda i: {"type": "function", "name": f"f{i}"})}),
        "responses_items": ("/v1/responses", {"max_output_tokens": 4, "input": fill(
            lambda i: {"type": "message", "role": "user", "content": "x"})}),
        "responses_metadata": ("/v1/responses", {"input": "hi", "max_output_tokens": 4, "store": False,
                                                 "metadata": metadata}),
        "completion_n128_long_stops": ("/v1/completions", {
            "prompt": "hi", "n": 128, "max_tokens": 2,
            "stop": [f"{i}" + "z" * (127 << 10) for i in range(64)]}),
    }


async def scenario_bulk(args: argparse.Namespace) -> dict[str, Any]:
    limit = args.max_body_mib << 20
    rss_before = read_rss_mib(args.server_pid)
    cases: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=args.base_url, timeout=args.request_timeout,
                                 headers=auth(args)) as c:
        async def small() -> tuple[int | None, float]:
            await asyncio.sleep(0.05)
            t0 = time.monotonic()
            try:
                status = (await c.post("/v1/completions", json=SMALL_COMPLETION)).status_code
            except httpx.HTTPError:
                status = None
            return status, round(time.monotonic() - t0, 3)

        for name, (path, body) in bulk_cases(limit).items():
            data = json.dumps(body).encode()
            t0 = time.monotonic()
            beside = asyncio.create_task(small())
            try:
                r = await c.post(path, content=data, headers={"content-type": "application/json"})
                status, head = r.status_code, r.text[:120]
            except httpx.HTTPError as e:
                status, head = None, type(e).__name__
            took = round(time.monotonic() - t0, 3)
            small_status, small_s = await beside
            ok = status is not None and status < 500 and took <= args.bulk_max_s \
                and small_status == 200 and small_s <= args.bulk_max_s
            cases[name] = {"mib": round(len(data) / 2**20, 2), "status": status, "s": took,
                           "small_status": small_status, "small_s": small_s, "ok": ok,
                           "message": head}
    result = {"scenario": "bulk", "cases": cases, "rss_mib_before": rss_before,
              "rss_mib_after": read_rss_mib(args.server_pid),
              "ok": all(c["ok"] for c in cases.values())}
    emit(result, [f"{k}: {v['status']} in {v['s']} s, small request {v['small_status']} in "
                  f"{v['small_s']} s {'ok' if v['ok'] else 'FAILED'}" for k, v in cases.items()])
    return result


# ----------------------------------------------------------------------------
# store: what the Responses store holds, and for whom
# ----------------------------------------------------------------------------

def heavy_tools() -> list[dict[str, Any]]:
    """128 tools whose schemas, 58 KiB each, are many small properties."""
    props = {f"p{i}": {} for i in range(4400)}
    return [{"type": "function", "name": f"f{t}",
             "parameters": {"type": "object", "properties": props}} for t in range(128)]


async def scenario_store(args: argparse.Namespace) -> dict[str, Any]:
    body = {"input": "Hi", "max_output_tokens": 1, "tools": heavy_tools(), "tool_choice": "none"}
    data = json.dumps(body).encode()
    ids: list[str] = []
    size = 0
    async with httpx.AsyncClient(base_url=args.base_url, timeout=args.request_timeout,
                                 headers=auth(args)) as c:
        unkept = json.dumps({**body, "store": False}).encode()
        for _ in range(args.store_requests):
            await c.post("/v1/responses", content=unkept, headers={"content-type": "application/json"})
        rss_before = read_rss_mib(args.server_pid)
        for _ in range(args.store_requests):
            r = await c.post("/v1/responses", content=data, headers={"content-type": "application/json"})
            if r.status_code == 200:
                ids.append(r.json()["id"])
                size = len(r.content)
        rss_after = read_rss_mib(args.server_pid)
        health: list[float] = []
        get_ok = bool(ids)
        get_s = 0.0
        if ids:
            want = (await c.get(f"/v1/responses/{ids[0]}")).content

            # Bytes compared, not parsed: parsing here would slow this
            # event loop, and with it the /health probes.
            async def get() -> tuple[bool, float]:
                t0 = time.monotonic()
                r = await c.get(f"/v1/responses/{ids[0]}")
                return r.status_code == 200 and r.content == want, time.monotonic() - t0

            gets = [asyncio.create_task(get()) for _ in range(args.store_gets)]
            while not all(g.done() for g in gets):
                health.append((await probe(args.base_url, "GET", "/health"))["latency_s"])
            done = [await g for g in gets]
            get_ok = all(ok for ok, _ in done)
            get_s = round(max(s for _, s in done), 3)
        cross: dict[str, Any] = {}
        if ids and len(args.api_key or []) > 1:
            b = auth(args, 1)
            cross["get"] = (await c.get(f"/v1/responses/{ids[0]}", headers=b)).status_code
            cross["continue"] = (await c.post("/v1/responses", headers=b, json={
                "input": "more", "max_output_tokens": 1, "previous_response_id": ids[0]})).status_code
            cross["delete"] = (await c.delete(f"/v1/responses/{ids[0]}", headers=b)).status_code
    growth = None
    if rss_before is not None and rss_after is not None and ids:
        growth = round((rss_after - rss_before) / len(ids), 1)
    response_mib = round(size / 2**20, 2)
    ok = len(ids) == args.store_requests and get_ok and max(health, default=0) < 1.0 \
        and all(s == 404 for s in cross.values()) \
        and (growth is None or growth < 3 * response_mib)
    result = {"scenario": "store", "stored": len(ids), "response_mib": response_mib,
              "rss_mib_before": rss_before, "rss_mib_after": rss_after,
              "rss_growth_per_response_mib": growth, "get_s": get_s,
              "health_max_s": max(health, default=None), "cross_key": cross, "ok": ok}
    emit(result, [f"stored {len(ids)} responses of {response_mib} MiB; RSS {rss_before} -> "
                  f"{rss_after} MiB ({growth} MiB each)",
                  f"{args.store_gets} GETs: slowest {get_s} s; /health at most "
                  f"{result['health_max_s']} s", f"another key: {cross}"])
    return result


RUNNERS = {
    "soak": scenario_soak,
    "storm": scenario_storm,
    "idle": scenario_idle,
    "slow": scenario_slow,
    "abuse": scenario_abuse,
    "fair": scenario_fair,
    "grammar": scenario_grammar,
    "bulk": scenario_bulk,
    "store": scenario_store,
}


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        description="Hostile-client measurements against a wick server.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the module docstring for what each reported number means.",
    )
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                   help=f"any of {', '.join(SCENARIOS)} (default: all)")
    p.add_argument("--only", default="", help="comma-separated scenarios, same as positionals")
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--server-pid", type=int, default=None,
                   help="server process id, for RSS from /proc/PID/status")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api-key", action="append",
                   help="a key the server takes (bulk and store); a second one for store's "
                        "cross-key checks")
    p.add_argument("--ready-timeout", type=float, default=30.0,
                   help="seconds to wait for GET /health to be 200 first")
    p.add_argument("--request-timeout", type=float, default=120.0,
                   help="per-request timeout for generation requests")
    g = p.add_argument_group("soak")
    g.add_argument("-n", "--requests", type=int, default=1500)
    g.add_argument("-c", "--concurrency", type=int, default=32)
    g = p.add_argument_group("storm")
    g.add_argument("-m", "--clients", type=int, default=200)
    g.add_argument("--first-event-timeout", type=float, default=120.0)
    g.add_argument("--drain-timeout", type=float, default=60.0)
    g = p.add_argument_group("idle")
    g.add_argument("-k", "--connections", type=int, default=2000)
    g.add_argument("--idle-wait", type=float, default=40.0)
    g = p.add_argument_group("slow")
    g.add_argument("-s", "--slow-conns", type=int, default=50)
    g.add_argument("--slow-interval", type=float, default=5.0)
    g.add_argument("--slow-max-wait", type=float, default=90.0)
    g = p.add_argument_group("fair")
    g.add_argument("--fair-probes", type=int, default=4)
    g.add_argument("--fair-max-ttft", type=float, default=2.0)
    g = p.add_argument_group("grammar")
    g.add_argument("--grammar-plain", type=int, default=32)
    g.add_argument("--grammar-max-slowdown", type=float, default=1.35)
    g = p.add_argument_group("bulk")
    g.add_argument("--max-body-mib", type=int, default=8)
    g.add_argument("--bulk-max-s", type=float, default=2.0)
    g = p.add_argument_group("store")
    g.add_argument("--store-requests", type=int, default=8)
    g.add_argument("--store-gets", type=int, default=16)
    args = p.parse_args(argv)
    chosen = list(args.scenarios) + [s for s in args.only.split(",") if s.strip()]
    chosen = [s.strip() for s in chosen]
    bad = [s for s in chosen if s not in SCENARIOS]
    if bad:
        p.error(f"unknown scenario(s) {bad}; choose from {', '.join(SCENARIOS)}")
    order = [s for s in SCENARIOS if s in chosen] or list(SCENARIOS)
    return args, order


async def wait_ready(base_url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=base_url, timeout=5) as c:
        while True:
            try:
                if (await c.get("/health")).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.5)


async def amain(args: argparse.Namespace, order: list[str]) -> int:
    if not await wait_ready(args.base_url, args.ready_timeout):
        print(f"{args.base_url}/health did not answer 200 within {args.ready_timeout} s",
              file=sys.stderr)
        return 2
    all_ok = True
    for name in order:
        result = await RUNNERS[name](args)
        all_ok &= bool(result["ok"])
    return 0 if all_ok else 1


def main() -> None:
    args, order = parse_args()
    sys.exit(asyncio.run(amain(args, order)))


if __name__ == "__main__":
    main()
