#!/usr/bin/env python3
"""Load generator for OpenAI-compatible completion servers (streaming).

Sends N requests to POST {base}/v1/completions with stream=true, at most C in
flight (-c; 0 for no limit), optionally arriving as a Poisson process at
--rate req/s, and reports time to first token (TTFT), inter-token latency
(ITL), time per output token (TPOT), end-to-end latency, output tokens/s and
requests/s. A summary goes to stderr; the last line on stdout is one JSON
object with every figure (`--json-out FILE` also appends it to FILE), so
runs of two servers can be collected in one file and compared
(`scripts/plot_loadgen.py` tabulates such a file).

Workload:
- Each request asks for --max-tokens tokens at temperature 0 and sends
  `ignore_eos` and `min_tokens` (wick, vLLM and llama.cpp honour them), so
  every completion has the same length; --no-ignore-eos leaves them out.
- Prompts are "Request I:" followed by words drawn from a fixed list by a
  generator seeded with --seed and I, so every prompt is unique (a prefix
  cache cannot skip prefill) and a given seed gives the same prompts as every
  earlier run with it. Without --seed the seed is random, and printed in the
  JSON. Where the server has llama.cpp-style POST /tokenize (`{"content":
  text}` answered by `{"tokens": [...]}`, as wick and llama-server have), each
  prompt is the longest run of its words that is at most --prompt-tokens
  tokens (exactly that many when a word boundary falls there); otherwise,
  or with --tokenize never, the word count stands in for the token count.
- --warmup requests (default 1) run one at a time before timing starts.
- A token is counted when a stream chunk carries a choice with text, or a
  choice without a finish reason (a final chunk carrying only the finish
  reason is not a token); where the server reports `usage`, its
  completion_tokens is the request's output.

--server-pid PID adds the share of the machine's CPU that the server and
other processes took during the timed run (`cpu_server_frac`,
`cpu_other_frac`, from /proc, Linux only): on a small machine a background
build ruins every figure, so check `cpu_other_frac` before trusting one.
--wait-quiet S first waits up to S seconds for other processes to go idle.

Standard library only: each request is one HTTP/1.1 connection driven by
asyncio (http and https), so the measurement adds no thread switching.
--timeout bounds each wait on the server (connecting, and each read of the
response), not a whole stream.

Example:
    python3 scripts/loadgen.py --base-url http://127.0.0.1:8000 -n 64 -c 32 \\
        --prompt-tokens 128 --max-tokens 128 --label wick-c32 \\
        --server-pid "$(pgrep -n wick)" --json-out runs.jsonl

Exit status: 0 when every request streamed tokens, 1 otherwise.
"""

import argparse
import asyncio
import json
import random
import ssl
import sys
import time
import urllib.parse

# The words prompts are drawn from, in the order the seed picks them by: a
# change here changes every seeded prompt.
WORDS = (
    "the of and to in is was for on that with as by at from his her an "
    "which time river house light garden market window music stone paper "
    "winter summer north south green silver quiet rapid ancient modern "
    "doctor teacher farmer village city mountain valley ocean forest "
    "bridge engine story letter answer number system question morning "
    "evening yellow purple walks runs builds writes reads finds keeps"
).split()

# Figures printed to stderr, in this order.
SUMMARY = (
    "ok", "failed", "short_completions", "prompt_tokens_mean",
    "prompt_cached_tokens_total", "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99",
    "itl_ms_p50", "itl_ms_p99", "tpot_ms_mean", "e2e_ms_p50", "e2e_ms_p99",
    "output_tok_s", "req_s", "server_prompt_tok_s_mean",
    "server_gen_tok_s_mean", "cpu_server_frac", "cpu_other_frac",
)


# --- HTTP/1.1 over asyncio streams -----------------------------------------


class HttpError(Exception):
    pass


class Server:
    """Where requests go: scheme, host, port and path prefix of --base-url."""

    def __init__(self, base_url, timeout):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise SystemExit(f"--base-url must be http(s)://HOST[:PORT][/PATH], not {base_url!r}")
        self.tls = ssl.create_default_context() if u.scheme == "https" else None
        self.host = u.hostname
        self.port = u.port or (443 if self.tls else 80)
        self.prefix = u.path.rstrip("/")
        default_port = self.port == (443 if self.tls else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default_port else f"{host}:{self.port}"
        self.timeout = timeout

    async def _wait(self, aw):
        return await asyncio.wait_for(aw, self.timeout)

    async def open(self, method, path, body=None):
        """Sends one request on a fresh connection; returns (status, reader
        of the body's chunks as bytes, closer)."""
        reader, writer = await self._wait(
            asyncio.open_connection(self.host, self.port, ssl=self.tls)
        )
        try:
            data = b"" if body is None else json.dumps(body).encode()
            head = [
                f"{method} {self.prefix}{path} HTTP/1.1",
                f"Host: {self.host_header}",
                "User-Agent: wick-loadgen",
                "Accept: */*",
                "Connection: close",
            ]
            if body is not None:
                head += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
            await self._wait(writer.drain())
            status_line = await self._wait(reader.readline())
            parts = status_line.decode("latin-1").split(None, 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/"):
                raise HttpError(f"bad status line {status_line[:80]!r}")
            status = int(parts[1])
            headers = {}
            while True:
                line = await self._wait(reader.readline())
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
        except BaseException:
            writer.close()
            raise
        return status, self._body(reader, headers), writer.close

    async def _body(self, reader, headers):
        """The body's bytes as they arrive: chunked, sized or up to EOF."""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                size_line = await self._wait(reader.readline())
                if not size_line:
                    raise HttpError("connection closed inside a chunked body")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    return
                chunk = await self._wait(reader.readexactly(size + 2))
                yield chunk[:-2]
        elif "content-length" in headers:
            left = int(headers["content-length"])
            while left > 0:
                chunk = await self._wait(reader.read(min(left, 1 << 16)))
                if not chunk:
                    raise HttpError("connection closed before the body's end")
                left -= len(chunk)
                yield chunk
        else:
            while chunk := await self._wait(reader.read(1 << 16)):
                yield chunk

    async def call(self, method, path, body=None):
        """(status, whole body as bytes)."""
        status, chunks, close = await self.open(method, path, body)
        try:
            return status, b"".join([c async for c in chunks])
        finally:
            close()

    async def json(self, method, path, body=None):
        status, data = await self.call(method, path, body)
        if status != 200:
            raise HttpError(f"HTTP {status}")
        return json.loads(data)


async def lines(chunks):
    """The body split into lines (without their line ends)."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        *done, pending = pending.split(b"\n")
        for line in done:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
    if pending:
        yield pending.rstrip(b"\r").decode("utf-8", "replace")


# --- prompts -----------------------------------------------------------------


def prompt_words(i, seed, n):
    """Request i's prompt of n drawn words: each n's prompt extends the
    shorter ones', so its token count grows with n."""
    pick = random.Random(seed * 1_000_003 + i)
    return " ".join([f"Request {i}:"] + [pick.choice(WORDS) for _ in range(n)])


async def token_count(server, text):
    """Tokens in `text` by the server's POST /tokenize; None without one."""
    try:
        return len((await server.json("POST", "/tokenize", {"content": text}))["tokens"])
    except (OSError, asyncio.TimeoutError, HttpError, ValueError, KeyError, TypeError):
        return None


async def make_prompt(server, i, args, exact):
    """(prompt, its token count or None) for request i."""
    target = args.prompt_tokens
    n = max(1, target - 3)  # "Request I:" is about three tokens, each word about one
    if not exact:
        return prompt_words(i, args.seed, n), None
    counts = {}

    async def count(n):
        if n not in counts:
            counts[n] = await token_count(server, prompt_words(i, args.seed, n))
        return counts[n]

    # Jump by the tokens missing (or in excess), a word being at least one
    # token, then settle on the longest prompt of at most `target` tokens.
    k = await count(n)
    for _ in range(8):
        if k is None or k == target or max(1, n + target - k) == n:
            break
        n = max(1, n + target - k)
        k = await count(n)
    if k is None:
        return prompt_words(i, args.seed, n), None
    while k > target and n > 1:
        n -= 1
        k = await count(n)
    while k < target:
        above = await count(n + 1)
        if above is None or above > target:
            break
        n, k = n + 1, above
    return prompt_words(i, args.seed, n), k


# --- one request ---------------------------------------------------------------


async def complete(server, args, prompt):
    """Streams one completion. Returns its start and end times, each
    token's arrival time, the server's usage and llama.cpp timings where
    sent, and ok (or an error)."""
    body = {
        "model": args.model,
        "prompt": prompt,
        "max_tokens": args.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if not args.no_ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = args.max_tokens
    r = {"ok": False, "token_times": [], "usage": None, "timings": None}
    r["t0"] = time.perf_counter()
    close = None
    try:
        status, chunks, close = await server.open("POST", "/v1/completions", body)
        if status != 200:
            text = b"".join([c async for c in chunks])
            r["error"] = f"HTTP {status}: {text[:200]!r}"
        else:
            async for line in lines(chunks):
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                now = time.perf_counter()
                choices = event.get("choices") or []
                if choices and (choices[0].get("text") or choices[0].get("finish_reason") is None):
                    r["token_times"].append(now)
                if event.get("usage"):
                    r["usage"] = event["usage"]
                if event.get("timings"):
                    r["timings"] = event["timings"]
            r["ok"] = bool(r["token_times"])
            if not r["ok"]:
                r["error"] = "no tokens streamed"
    except Exception as e:  # refused, reset, timed out, not JSON
        r["error"] = f"{type(e).__name__}: {e}"
    finally:
        if close:
            close()
    r["t_end"] = time.perf_counter()
    return r


# --- CPU accounting (Linux /proc) ------------------------------------------------


def cpu_times(pid):
    """(machine busy, machine total, the server's, this process's) CPU
    time in clock ticks so far; None where /proc cannot tell."""

    def proc_ticks(path):
        fields = open(path).read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
        total = sum(ticks)
        busy = total - ticks[3] - ticks[4]  # less idle and iowait
        server = proc_ticks(f"/proc/{pid}/stat") if pid else 0
        return busy, total, server, proc_ticks("/proc/self/stat")
    except (OSError, ValueError, IndexError):
        return None


def cpu_shares(before, after):
    """(server, others, this process) as fractions of the machine's CPU
    between two `cpu_times`."""
    busy, total, server, own = (b - a for a, b in zip(before, after))
    total = max(total, 1)
    return server / total, max(busy - server - own, 0) / total, own / total


async def wait_quiet(pid, limit_s, below=0.05):
    """Waits until other processes take under `below` of the CPU over two
    seconds, or `limit_s` have passed; returns the last share seen (None
    without /proc)."""
    give_up = time.perf_counter() + limit_s
    while True:
        before = cpu_times(pid)
        await asyncio.sleep(2.0)
        after = cpu_times(pid)
        if before is None or after is None:
            return None
        other = cpu_shares(before, after)[1]
        if other < below or time.perf_counter() > give_up:
            return round(other, 3)


# --- the run -------------------------------------------------------------------


async def run(args):
    server = Server(args.base_url, args.timeout)
    if args.model is None:
        try:
            args.model = (await server.json("GET", "/v1/models"))["data"][0]["id"]
        except Exception:
            args.model = "default"
    exact = args.tokenize != "never"
    if args.tokenize == "auto":
        exact = await token_count(server, "hello world") is not None
    # Every prompt is made before timing starts; warm-up ones are numbered
    # below zero.
    made = []
    for i in range(-args.warmup, args.num_requests):
        made.append(await make_prompt(server, i, args, exact))
    prompt_tokens = [k for _, k in made if k is not None]
    prompts = [p for p, _ in made]
    for p in prompts[: args.warmup]:
        await complete(server, args, p)
    prompts = prompts[args.warmup :]
    quiet = await wait_quiet(args.server_pid, args.wait_quiet) if args.wait_quiet else None

    slots = asyncio.Semaphore(args.concurrency if args.concurrency > 0 else len(prompts) + 1)
    arrivals = random.Random(args.seed)
    stop_starting = time.perf_counter() + args.max_duration

    async def one(prompt):
        async with slots:
            if time.perf_counter() > stop_starting:
                return {"ok": False, "error": "skipped: --max-duration reached", "token_times": []}
            return await complete(server, args, prompt)

    cpu_before, start = cpu_times(args.server_pid), time.perf_counter()
    tasks = []
    for p in prompts:
        tasks.append(asyncio.ensure_future(one(p)))
        if args.rate:
            await asyncio.sleep(arrivals.expovariate(args.rate))
    results = await asyncio.gather(*tasks)
    wall, cpu_after = time.perf_counter() - start, cpu_times(args.server_pid)

    out = summarize(args, results, wall, prompt_tokens, exact)
    out["cpu_other_frac_before"] = quiet
    if cpu_before and cpu_after:
        server_frac, other_frac, own_frac = cpu_shares(cpu_before, cpu_after)
        out["cpu_loadgen_frac"] = round(own_frac, 3)
        if args.server_pid:
            out["cpu_server_frac"] = round(server_frac, 3)
            out["cpu_other_frac"] = round(other_frac, 3)
    return out


def percentile(xs, p):
    """The p-th percentile, interpolating between ranks; None when empty."""
    if not xs:
        return None
    xs = sorted(xs)
    at = (len(xs) - 1) * p / 100.0
    lo = int(at)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (at - lo)


def ms(seconds):
    return None if seconds is None else round(seconds * 1000.0, 2)


def mean(xs, digits):
    return round(sum(xs) / len(xs), digits) if xs else None


def summarize(args, results, wall, prompt_tokens, exact):
    ok = [r for r in results if r["ok"]]
    ttft, itl, tpot, e2e, outputs = [], [], [], [], []
    server_pp, server_tg = [], []
    short = cached = 0
    for r in ok:
        times = r["token_times"]
        usage = r["usage"] or {}
        n = usage.get("completion_tokens") or len(times)
        ttft.append(times[0] - r["t0"])
        e2e.append(r["t_end"] - r["t0"])
        itl.extend(b - a for a, b in zip(times, times[1:]))
        if n > 1:
            tpot.append((times[-1] - times[0]) / (n - 1))
        outputs.append(n)
        short += n < args.max_tokens
        # Prompt tokens the server took from its cache: ~0 with unique prompts.
        cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        timings = r["timings"] or {}
        if timings.get("prompt_per_second"):
            server_pp.append(timings["prompt_per_second"])
        if timings.get("predicted_per_second"):
            server_tg.append(timings["predicted_per_second"])
    errors = sorted({r.get("error", "") for r in results if not r["ok"]})
    return {
        "label": args.label,
        "base_url": args.base_url,
        "model": args.model,
        "seed": args.seed,
        "num_requests": len(results),
        "concurrency": args.concurrency,
        "rate": args.rate,
        "prompt_tokens_target": args.prompt_tokens,
        "prompt_tokens_mean": mean(prompt_tokens, 1),
        "prompt_tokenized_exact": exact,
        "max_tokens": args.max_tokens,
        "ok": len(ok),
        "failed": len(results) - len(ok),
        "errors": errors[:5],
        "short_completions": short,
        "prompt_cached_tokens_total": cached,
        "completion_tokens_total": sum(outputs),
        "wall_s": round(wall, 3),
        "ttft_ms_p50": ms(percentile(ttft, 50)),
        "ttft_ms_p90": ms(percentile(ttft, 90)),
        "ttft_ms_p99": ms(percentile(ttft, 99)),
        "itl_ms_p50": ms(percentile(itl, 50)),
        "itl_ms_p99": ms(percentile(itl, 99)),
        "tpot_ms_mean": ms(sum(tpot) / len(tpot)) if tpot else None,
        "tpot_ms_p50": ms(percentile(tpot, 50)),
        "e2e_ms_p50": ms(percentile(e2e, 50)),
        "e2e_ms_p99": ms(percentile(e2e, 99)),
        "output_tok_s": round(sum(outputs) / wall, 2) if wall else None,
        "req_s": round(len(ok) / wall, 3) if wall else None,
        # llama-server's own per-request speeds (its "timings" extension).
        "server_prompt_tok_s_mean": mean(server_pp, 1),
        "server_gen_tok_s_mean": mean(server_tg, 1),
    }


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.split("\n")[2:]),
    )
    ap.add_argument("--base-url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default=None, help="model name (default: first of /v1/models)")
    ap.add_argument("-n", "--num-requests", type=int, default=16)
    ap.add_argument("-c", "--concurrency", type=int, default=1, help="max in flight (0 = unbounded)")
    ap.add_argument("--rate", type=float, default=None, help="Poisson arrival rate, req/s")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument(
        "--tokenize",
        choices=["auto", "always", "never"],
        default="auto",
        help="use server /tokenize to hit the exact prompt length",
    )
    ap.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos/min_tokens")
    ap.add_argument("--warmup", type=int, default=1, help="sequential unmeasured requests first")
    ap.add_argument("--timeout", type=float, default=300.0, help="longest wait on the server (connecting, each read), s")
    ap.add_argument(
        "--max-duration",
        type=float,
        default=600.0,
        help="stop starting new requests after this many seconds",
    )
    ap.add_argument(
        "--server-pid",
        type=int,
        default=None,
        help="server PID, to report its CPU share and other processes' share",
    )
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="S",
        help="before timing, wait up to S s for other processes to go idle",
    )
    ap.add_argument(
        "--seed",
        type=int,
        default=None,
        help="prompt seed (default: random, so a server's prompt cache "
        "cannot reuse an earlier run's prompts; printed in the JSON)",
    )
    ap.add_argument("--label", default="")
    ap.add_argument("--json-out", default=None, help="append the JSON result line to this file")
    args = ap.parse_args(argv)
    args.base_url = args.base_url.rstrip("/")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 30)
    return args


def main():
    args = parse_args()
    out = asyncio.run(run(args))
    for key in SUMMARY:
        print(f"{key:>26}: {out.get(key)}", file=sys.stderr)
    line = json.dumps(out)
    if args.json_out:
        with open(args.json_out, "a") as f:
            f.write(line + "\n")
    print(line)
    return 0 if out["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
