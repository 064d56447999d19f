"""How much time each client adds between the server writing an event and the client stamping it.

Starts the simulator (noise off) in a child process and, for each client, compares the client's
own arrival stamp of the event it counts as "the first token" with the simulator's write stamp of
that same event. Both are `time.perf_counter_ns()` (CLOCK_MONOTONIC), comparable across processes
on Linux, so the difference is loopback delivery plus everything the client does before stamping:
event-loop wake-up, its HTTP stack, buffering, parsing.

    ttft-monitor  ProbeClient, first generated token   vs first_token_write_ns
                  (bytes timed by the kernel's arrival stamps)
    tm-loop-read  the same, TTFT_KERNEL_TIMESTAMPS=0:  vs first_token_write_ns
                  bytes timed when its loop reads them
    requests      first `data:` line (iter_lines)      vs first_event_write_ns (that line is the role chunk)
    openai        first chunk with delta.content       vs first_answer_write_ns
    floor         raw asyncio protocol, stamped in     vs first_token_write_ns
                  data_received: what any Python client on this machine pays before it can stamp

Two scenarios, every client in each, interleaved so they share the machine's noise: sequential
probes, and batches of concurrent streams (threads for requests, tasks on one loop for the others).

    .venv/bin/python bench/probe_overhead.py [--samples 200] [--concurrency 100] [--batches 10]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import openai
import requests
from openai import AsyncOpenAI

from monitor.probe.apis import FLAVORS, RequestParams
from monitor.probe.client import Endpoint, ProbeClient, Timeouts
from monitor.probe.prompts import build_text
from monitor.probe.result import Sample
from monitor.quantile import quantile
from monitor.sim.profiles import default_profiles

ROOT = Path(__file__).resolve().parent.parent
MODEL = "qwen3-8b"
# Thinking off, so the first generated token is content and every client counts a token.
NO_THINKING: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": False}}
TTFT_MS = 50.0
# Each stream decodes at the simulator's own qwen3-8b rate (90 tok/s, a real server's per-stream
# speed), so 100 streams send ~9,000 events/s. `--decode-tps 1000` is the stress case: 100,000
# events/s, more than one Python event loop parses (~30-50 us per event), so the client saturates
# and the overhead measures its backlog rather than its stamping.
DEFAULT_DECODE_TPS = default_profiles()[MODEL].decode_tps
MAX_TOKENS = 8
PROMPT_CHARS = 700  # ~200 tokens on the simulator's tokenizer, nonce included
WARMUP_SEQUENTIAL = 5
SIM_START_TIMEOUT_S = 20.0

TTFT_MONITOR = "ttft-monitor"
# The same client with bytes timed when its loop reads them (no kernel arrival stamps).
TTFT_MONITOR_LOOP = "tm-loop-read"
REQUESTS = "requests"
OPENAI = "openai"
FLOOR = "floor"
CLIENTS = (TTFT_MONITOR, TTFT_MONITOR_LOOP, REQUESTS, OPENAI, FLOOR)
# The simulator stamp of the event each client counts as its first token.
WRITE_STAMP = {
    TTFT_MONITOR: "first_token_write_ns",
    TTFT_MONITOR_LOOP: "first_token_write_ns",
    REQUESTS: "first_event_write_ns",
    OPENAI: "first_answer_write_ns",
    FLOOR: "first_token_write_ns",
}
# A content delta with at least one character: the role chunk's `"content":""` does not match.
FIRST_CONTENT = re.compile(rb'"content":"(?!")')

SEQ_MEDIAN_TARGET_MS = 0.5
CONC_P99_TARGET_MS = 3.0


class BenchError(Exception):
    """The benchmark cannot produce a trustworthy figure; the message says what broke."""


@dataclass(frozen=True, slots=True)
class Observation:
    """One request as a client saw it; stamps are perf_counter_ns in this process."""

    client: str
    request_id: str
    arrival_ns: int  # when the client stamped the event it counts as the first token
    reported_ttft_ms: float  # the TTFT this client would report


@dataclass(frozen=True, slots=True)
class Measured:
    client: str
    scenario: str
    overhead_ms: list[float]  # sorted
    ttft_error_ms: list[float]  # reported TTFT minus the simulator's configured TTFT, sorted
    prompt_tokens: list[int]


# --- the simulator in a child process ------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def simulator(port: int) -> Iterator[str]:
    """The simulator on 127.0.0.1:port, noise off; yields its root URL and stops it on the way out.

    A child process, not a task on our loop: serving on the clients' loop would skew every stamp.
    """
    with tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen(
            [sys.executable, "-m", "monitor", "sim", "--host", "127.0.0.1", "--port", str(port), "--no-noise"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            _wait_until_listening(child, stderr, port)
            yield f"http://127.0.0.1:{port}"
        finally:
            child.terminate()
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _wait_until_listening(child: subprocess.Popen[str], stderr: Any, port: int) -> None:
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        # Keeps draining stdout after the ready line, so the child can never block on a full pipe.
        assert child.stdout is not None
        for line in child.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, name="sim-stdout", daemon=True).start()
    deadline = time.monotonic() + SIM_START_TIMEOUT_S
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        if line is not None and "simulator listening on" in line:
            return
        if line is None:
            child.poll()
            stderr.seek(0)
            err = stderr.read().decode(errors="replace").strip()[-500:]
            state = f"exited with code {child.returncode}" if child.returncode is not None else "timed out"
            raise BenchError(
                f"the simulator on port {port} did not start ({state}); run "
                f"`{sys.executable} -m monitor sim --port {port}` to see why. stderr: {err or '(empty)'}"
            )


def configure_model(http: requests.Session, root: str, decode_tps: float) -> None:
    patch = {"ttft_base_ms": TTFT_MS, "prefill_ms_per_1k": 0, "decode_tps": decode_tps}
    resp = http.post(f"{root}/sim/models/{MODEL}", json=patch, timeout=10)
    if resp.status_code != 200:
        raise BenchError(f"POST /sim/models/{MODEL} answered {resp.status_code}: {resp.text[:300]}")


def fetch_stamps(root: str, request_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The simulator's record of each request; fetched between scenarios, never while measuring."""
    local = threading.local()

    def fetch(rid: str) -> dict[str, Any]:
        session: requests.Session | None = getattr(local, "session", None)
        if session is None:
            session = local.session = requests.Session()
        resp = session.get(f"{root}/sim/requests/{rid}", timeout=10)
        if resp.status_code != 200:
            raise BenchError(
                f"GET /sim/requests/{rid} answered {resp.status_code}: {resp.text[:200]}; "
                "the simulator lost the stamps of this request"
            )
        stamp: dict[str, Any] = resp.json()
        return stamp

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(request_ids, pool.map(fetch, request_ids), strict=True))


# --- the clients -----------------------------------------------------------------------------


def new_prompt() -> str:
    # A unique nonce first: the simulator's prefix cache must never shorten a prefill.
    return build_text("en", PROMPT_CHARS, nonce=uuid.uuid4().hex[:16])


def request_body(prompt: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **NO_THINKING,
    }


class TtftMonitorClient:
    def __init__(self, root: str, *, kernel_stamps: bool = True) -> None:
        self.name = TTFT_MONITOR if kernel_stamps else TTFT_MONITOR_LOOP
        self.client = ProbeClient(kernel_stamps=kernel_stamps)
        self.endpoint = Endpoint(
            base_url=f"{root}/v1",
            flavor=FLAVORS["openai-chat"],
            timeouts=Timeouts(connect=5.0, first_token=30.0, total=60.0),
        )
        self.params = RequestParams(
            model=MODEL, max_tokens=MAX_TOKENS, temperature=0.0, extra_body=NO_THINKING, include_usage=True
        )

    async def probe(self) -> Observation:
        sample = Sample(target="bench", model=MODEL, api="openai-chat", prompt="bench", round=0)
        await self.client.probe(self.endpoint, self.params, new_prompt(), sample)
        if sample.error is not None or sample.ttft_ms is None or sample.sent_mono_ns is None:
            raise BenchError(f"{self.name}: probe failed ({sample.error}): {sample.error_message}")
        if not sample.request_id:
            raise BenchError(f"{self.name}: the response carried no x-request-id header")
        arrival = sample.sent_mono_ns + round(sample.ttft_ms * 1e6)
        return Observation(self.name, sample.request_id, arrival, sample.ttft_ms)

    async def batch(self, n: int) -> list[Observation]:
        return list(await asyncio.gather(*(self.probe() for _ in range(n))))

    async def close(self) -> None:
        await self.client.close()


class RequestsClient:
    """A streaming TTFT script as people write it: requests, iter_lines, stamp the first `data:` line."""

    def __init__(self, root: str, concurrency: int) -> None:
        self.url = f"{root}/v1/chat/completions"
        self._local = threading.local()
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="requests-probe")

    def _session(self) -> requests.Session:
        # One session per thread keeps each thread's connection warm, like the other clients' pools.
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def probe(self) -> Observation:
        body = request_body(new_prompt())
        session = self._session()
        start = time.perf_counter_ns()
        first: int | None = None
        try:
            with session.post(self.url, json=body, stream=True, timeout=30) as resp:
                resp.raise_for_status()
                for line in resp.iter_lines():
                    if first is None and line.startswith(b"data:"):
                        first = time.perf_counter_ns()
                rid = resp.headers.get("x-request-id")
        except requests.RequestException as exc:
            raise BenchError(f"{REQUESTS}: request failed: {exc}") from exc
        if first is None:
            raise BenchError(f"{REQUESTS}: the stream had no data line")
        if not rid:
            raise BenchError(f"{REQUESTS}: the response carried no x-request-id header")
        return Observation(REQUESTS, rid, first, (first - start) / 1e6)

    def batch(self, n: int) -> list[Observation]:
        return list(self.pool.map(lambda _: self.probe(), range(n)))

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class OpenAIClient:
    def __init__(self, root: str) -> None:
        self.client = AsyncOpenAI(base_url=f"{root}/v1", api_key="x", max_retries=0, timeout=30.0)

    async def probe(self) -> Observation:
        prompt = new_prompt()
        start = time.perf_counter_ns()
        first: int | None = None
        try:
            stream = await self.client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=NO_THINKING,
            )
            rid = stream.response.headers.get("x-request-id")
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter_ns()
        except openai.OpenAIError as exc:
            raise BenchError(f"{OPENAI}: request failed: {exc}") from exc
        if first is None:
            raise BenchError(f"{OPENAI}: the stream had no content chunk")
        if not rid:
            raise BenchError(f"{OPENAI}: the response carried no x-request-id header")
        return Observation(OPENAI, rid, first, (first - start) / 1e6)

    async def batch(self, n: int) -> list[Observation]:
        return list(await asyncio.gather(*(self.probe() for _ in range(n))))

    async def close(self) -> None:
        await self.client.close()


class _FirstContentProtocol(asyncio.Protocol):
    def __init__(self, done: asyncio.Future[None]) -> None:
        self.received = bytearray()
        self.first_ns: int | None = None
        self.done = done

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        self.received += data
        if self.first_ns is None and FIRST_CONTENT.search(self.received):
            self.first_ns = now

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


class FloorClient:
    """The least a Python asyncio client can do: write the request, stamp bytes as the loop hands them over.

    No HTTP library, no parsing before the stamp; one connection per request (`Connection: close`).
    Its overhead is the kernel, the event loop's wake-up and CPU contention: the floor under the others.
    """

    def __init__(self, root: str) -> None:
        self.host, port = root.removeprefix("http://").split(":")
        self.port = int(port)

    async def probe(self) -> Observation:
        loop = asyncio.get_running_loop()
        body = json.dumps(request_body(new_prompt())).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        done: asyncio.Future[None] = loop.create_future()
        transport, protocol = await loop.create_connection(lambda: _FirstContentProtocol(done), self.host, self.port)
        start = time.perf_counter_ns()
        transport.write(head.encode() + body)
        try:
            async with asyncio.timeout(30):
                await done
        finally:
            transport.close()
        found = re.search(rb"\r\nx-request-id: *([^\r]+)\r\n", bytes(protocol.received), re.IGNORECASE)
        if protocol.first_ns is None or found is None:
            raise BenchError(f"{FLOOR}: no content token or no x-request-id in {bytes(protocol.received[:200])!r}")
        return Observation(FLOOR, found.group(1).decode(), protocol.first_ns, (protocol.first_ns - start) / 1e6)

    async def batch(self, n: int) -> list[Observation]:
        return list(await asyncio.gather(*(self.probe() for _ in range(n))))


@dataclass(slots=True)
class Clients:
    ttft_monitor: TtftMonitorClient
    ttft_monitor_loop: TtftMonitorClient
    requests: RequestsClient
    openai: OpenAIClient
    floor: FloorClient

    async def one(self, name: str) -> Observation:
        if name == TTFT_MONITOR:
            return await self.ttft_monitor.probe()
        if name == TTFT_MONITOR_LOOP:
            return await self.ttft_monitor_loop.probe()
        if name == REQUESTS:
            return self.requests.probe()  # blocking on purpose: nothing else runs meanwhile
        if name == OPENAI:
            return await self.openai.probe()
        return await self.floor.probe()

    async def batch(self, name: str, n: int) -> list[Observation]:
        if name == TTFT_MONITOR:
            return await self.ttft_monitor.batch(n)
        if name == TTFT_MONITOR_LOOP:
            return await self.ttft_monitor_loop.batch(n)
        if name == REQUESTS:
            return self.requests.batch(n)  # the loop idles while the threads run
        if name == OPENAI:
            return await self.openai.batch(n)
        return await self.floor.batch(n)


# --- scenarios -------------------------------------------------------------------------------


def _rotations(round_no: int) -> tuple[str, ...]:
    # Rotate who goes first each round, so no client always follows the same neighbour.
    k = round_no % len(CLIENTS)
    return CLIENTS[k:] + CLIENTS[:k]


async def sequential(clients: Clients, samples: int) -> dict[str, list[Observation]]:
    for name in CLIENTS:
        for _ in range(WARMUP_SEQUENTIAL):
            await clients.one(name)
    seen: dict[str, list[Observation]] = {name: [] for name in CLIENTS}
    for i in range(samples):
        for name in _rotations(i):
            seen[name].append(await clients.one(name))
    return seen


async def concurrent(clients: Clients, concurrency: int, batches: int) -> dict[str, list[Observation]]:
    for name in CLIENTS:  # opens `concurrency` connections per client; not counted
        await clients.batch(name, concurrency)
    seen: dict[str, list[Observation]] = {name: [] for name in CLIENTS}
    for i in range(batches):
        for name in _rotations(i):
            await asyncio.sleep(0.05)  # let the previous batch's closing work finish first
            seen[name].extend(await clients.batch(name, concurrency))
    return seen


def measure(scenario: str, seen: dict[str, list[Observation]], stamps: dict[str, dict[str, Any]]) -> list[Measured]:
    out = []
    for name in CLIENTS:
        key = WRITE_STAMP[name]
        overhead, error, tokens = [], [], []
        for obs in seen[name]:
            stamp = stamps[obs.request_id]
            written = stamp.get(key)
            configured = stamp.get("configured_ttft_ms")
            if written is None or configured is None:
                missing = key if written is None else "configured_ttft_ms"
                raise BenchError(
                    f"{scenario} / {name}: the simulator recorded no {missing} for request "
                    f"{obs.request_id} (outcome {stamp.get('outcome')!r}, reasoning {stamp.get('reasoning')}); "
                    "check that thinking is off and max_tokens > 0"
                )
            overhead.append((obs.arrival_ns - written) / 1e6)
            error.append(obs.reported_ttft_ms - configured)
            tokens.append(stamp.get("prompt_tokens") or 0)
        out.append(Measured(name, scenario, sorted(overhead), sorted(error), tokens))
    return out


async def run_scenario(
    name: str, run: Callable[[], Awaitable[dict[str, list[Observation]]]], root: str
) -> list[Measured]:
    started = time.monotonic()
    print(f"{name}: running ...", file=sys.stderr, flush=True)
    seen = await run()
    ids = [obs.request_id for observations in seen.values() for obs in observations]
    stamps = fetch_stamps(root, ids)
    print(f"{name}: {len(ids)} requests in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return measure(name, seen, stamps)


# --- report ----------------------------------------------------------------------------------


def _p(values: list[float], percent: float) -> float:
    result = quantile(values, percent / 100, presorted=True)
    assert result is not None
    return result


def _ratio(value: float, reference: float) -> str:
    if reference <= 0:
        return "n/a"
    return f"{value / reference:.1f}x"


def overhead_table(results: list[Measured]) -> list[str]:
    head = (
        f"{'client':<13} {'scenario':<15} {'n':>5} {'median':>8} {'p90':>8} {'p99':>8} {'max':>8}"
        f"  {'median/tm':>9} {'p99/tm':>7}"
    )
    lines = [head, "-" * len(head)]
    for scenario in dict.fromkeys(m.scenario for m in results):
        rows = [m for m in results if m.scenario == scenario]
        ref = next(m for m in rows if m.client == TTFT_MONITOR).overhead_ms
        for m in rows:
            v = m.overhead_ms
            lines.append(
                f"{m.client:<13} {scenario:<15} {len(v):>5} {_p(v, 50):>8.3f} {_p(v, 90):>8.3f} "
                f"{_p(v, 99):>8.3f} {v[-1]:>8.3f}  {_ratio(_p(v, 50), _p(ref, 50)):>9} "
                f"{_ratio(_p(v, 99), _p(ref, 99)):>7}"
            )
    return lines


def ttft_table(results: list[Measured]) -> list[str]:
    head = f"{'client':<13} {'scenario':<15} {'n':>5} {'median':>8} {'p10':>8} {'p90':>8} {'p99':>8}"
    lines = [head, "-" * len(head)]
    for m in results:
        v = m.ttft_error_ms
        lines.append(
            f"{m.client:<13} {m.scenario:<15} {len(v):>5} {_p(v, 50):>8.2f} {_p(v, 10):>8.2f} "
            f"{_p(v, 90):>8.2f} {_p(v, 99):>8.2f}"
        )
    return lines


def targets(results: list[Measured], seq: str, conc: str) -> list[str]:
    def get(client: str, scenario: str) -> list[float]:
        return next(m.overhead_ms for m in results if m.client == client and m.scenario == scenario)

    def mark(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    seq_median = _p(get(TTFT_MONITOR, seq), 50)
    conc_p99 = _p(get(TTFT_MONITOR, conc), 99)
    lines = [
        f"  [{mark(seq_median < SEQ_MEDIAN_TARGET_MS)}] ttft-monitor median overhead < "
        f"{SEQ_MEDIAN_TARGET_MS} ms, {seq}: {seq_median:.3f} ms",
        f"  [{mark(conc_p99 < CONC_P99_TARGET_MS)}] ttft-monitor p99 overhead < {CONC_P99_TARGET_MS} ms, "
        f"{conc}: {conc_p99:.3f} ms",
    ]
    for scenario in (seq, conc):
        ours, theirs = get(TTFT_MONITOR, scenario), get(OPENAI, scenario)
        for q, label in ((50, "median"), (99, "p99")):
            a, b = _p(ours, q), _p(theirs, q)
            lines.append(
                f"  [{mark(a <= b)}] ttft-monitor no worse than the openai SDK, {scenario} {label}: "
                f"{a:.3f} vs {b:.3f} ms"
            )
    return lines


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_lines(load_at_start: str) -> list[str]:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [
        f"machine: {os.cpu_count()} CPUs ({usable} usable), {platform.system()} {platform.release()} "
        f"{platform.machine()}, Python {platform.python_version()} ({platform.python_implementation()}); "
        f"load 1/5/15 min at start: {load_at_start}",
        f"versions: aiohttp {version('aiohttp')}, openai {version('openai')}, requests {version('requests')}",
    ]


# --- main ------------------------------------------------------------------------------------


async def run_all(root: str, args: argparse.Namespace) -> list[Measured]:
    with requests.Session() as http:
        configure_model(http, root, args.decode_tps)
    clients = Clients(
        TtftMonitorClient(root),
        TtftMonitorClient(root, kernel_stamps=False),
        RequestsClient(root, args.concurrency),
        OpenAIClient(root),
        FloorClient(root),
    )
    if args.gc_freeze:
        # The imported libraries (the openai SDK above all) make every full collection walk some 10^5
        # objects, a pause of tens of ms that lands on whichever client is measuring. Freezing them
        # keeps the harness out of the figures; what the clients allocate is collected as usual.
        gc.collect()
        gc.freeze()
    try:
        seq_name, conc_name = "sequential", f"{args.concurrency} concurrent"
        results = await run_scenario(seq_name, lambda: sequential(clients, args.samples), root)
        results += await run_scenario(conc_name, lambda: concurrent(clients, args.concurrency, args.batches), root)
        return results
    finally:
        await clients.ttft_monitor.close()
        await clients.ttft_monitor_loop.close()
        await clients.openai.close()
        clients.requests.close()


def report(results: list[Measured], args: argparse.Namespace, load_at_start: str, elapsed_s: float) -> str:
    seq_name, conc_name = "sequential", f"{args.concurrency} concurrent"
    tokens = sorted(t for m in results for t in m.prompt_tokens)
    gc_note = "imports frozen out of gc (gc.freeze)" if args.gc_freeze else "gc untouched (--no-gc-freeze)"
    lines = [
        "Probe overhead: the client's arrival stamp of an event minus the simulator's write stamp of it",
        *machine_lines(load_at_start),
        f"simulator: {MODEL}, thinking off, noise off, configured TTFT {TTFT_MS:g} ms, "
        f"{args.decode_tps:g} tok/s per stream, max_tokens {MAX_TOKENS}; prompts {tokens[0]}-{tokens[-1]} tokens, "
        "each with a unique nonce",
        f"sequential: {args.samples} per client, round-robin; concurrent: {args.batches} batches of "
        f"{args.concurrency} streams per client, batches interleaved (requests: {args.concurrency} threads; "
        f"the others: tasks on one loop); all clients in one process, {gc_note}",
        "events: ttft-monitor first token vs first_token_write_ns; requests first `data:` line vs "
        "first_event_write_ns (the role chunk); openai first content chunk vs first_answer_write_ns;",
        "        floor (raw asyncio protocol, stamps in data_received, no HTTP library) first content token "
        "vs first_token_write_ns",
        "",
        "Overhead, ms (median/tm and p99/tm: this client's figure over ttft-monitor's)",
        *overhead_table(results),
        "",
        "TTFT as each client would report it, minus the simulator's configured TTFT, ms",
        "(includes sending the request; the requests script stamps the role chunk, sent before any token)",
        *ttft_table(results),
        "",
        "Targets:",
        *targets(results, seq_name, conc_name),
        "",
        f"finished in {elapsed_s:.1f} s; load 1/5/15 min at the end: {load_average()}",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200, help="sequential probes per client (default 200)")
    parser.add_argument(
        "--concurrency", type=int, default=100, help="streams in flight at once per batch (default 100)"
    )
    parser.add_argument("--batches", type=int, default=10, help="concurrent batches per client (default 10)")
    parser.add_argument(
        "--decode-tps",
        type=float,
        default=DEFAULT_DECODE_TPS,
        help=f"each stream's decode rate at the simulator (default {DEFAULT_DECODE_TPS:g}, its {MODEL} profile; "
        "1000 is the stress case)",
    )
    parser.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="leave the imported libraries in the garbage collector's reach (slower full collections)",
    )
    args = parser.parse_args(argv)
    for name in ("samples", "concurrency", "batches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if not args.decode_tps > 0:
        parser.error("--decode-tps must be above 0")
    return args


def _raise_on_sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through the `finally` that stops the simulator


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # Interruptible even when started in the background, where the shell ignores SIGINT for us.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    load_at_start = load_average()
    started = time.monotonic()
    try:
        with simulator(free_port()) as root:
            results = asyncio.run(run_all(root, args))
    except BenchError as exc:
        print(f"probe_overhead: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("probe_overhead: interrupted; simulator stopped", file=sys.stderr)
        return 130
    print(report(results, args, load_at_start, time.monotonic() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
