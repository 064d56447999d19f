"""The simulator: an aiohttp server that streams like vLLM/OpenAI and Anthropic, on a latency budget.

Each generation request gets a time to first token from its model's profile and prompt
(prefix-cache aware), then tokens at the decode rate. The first token is written within a
fraction of a millisecond of its deadline so the simulator can serve as a reference when
testing how accurately a client measures TTFT.

Endpoints: POST /v1/chat/completions, /v1/completions, /v1/messages, /v1/responses,
/v1beta/models/{model}:streamGenerateContent (Gemini; also under /v1); GET /v1/models, /health,
/metrics (the server's own metrics, under vLLM's names: see monitor.sim.metrics).
Control: GET /sim/models, POST /sim/models/{name} (partial profile), POST /sim/reset,
GET /sim/requests/{request_id} (timing stamps).
"""

from __future__ import annotations

import asyncio
import math
import random
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from monitor.kernel_clock import KernelStampedListener
from monitor.sim.arrival import ArrivalStamps
from monitor.sim.cache import PrefixCache, block_hashes
from monitor.sim.latency import Clock, sleep_until, sleep_until_precisely, token_gap_ns, ttft_ms
from monitor.sim.metrics import SimMetrics
from monitor.sim.parse import BadRequest, SimRequest, load_json
from monitor.sim.plan import ANSWER_TEXT, OutputPlan, plan_output
from monitor.sim.profiles import (
    Faults,
    ModelProfile,
    ProfileError,
    apply_patch,
    copy_profile,
    default_profiles,
    new_profile,
    profile_to_dict,
    without_noise,
)
from monitor.sim.stamps import Stamp, StampStore
from monitor.sim.tokens import tokenize
from monitor.sim.wire import COMMENT_PING, Family, Flavour, Generation, Route, Usage, dumps
from monitor.sim.wire import anthropic as anthropic_wire
from monitor.sim.wire import openai as openai_wire
from monitor.sim.wire.registry import FLAVORS

PING_INTERVAL_NS = 100_000_000
# How often a hanging response checks whether its client has gone.
HANG_POLL_S = 0.05
# Long prompts are the point of a TTFT test; aiohttp's default 1 MiB body limit is too small.
MAX_BODY_BYTES = 64 * 1024 * 1024


class Simulator:
    """All mutable simulator state: profiles, prefix caches, stamps and the seeded RNG."""

    def __init__(
        self,
        profiles: Mapping[str, ModelProfile] | None = None,
        *,
        noise: bool = True,
        seed: int | None = None,
        api_key: str | None = None,
        clock: Clock = time.perf_counter_ns,
        wall_clock: Callable[[], float] = time.time,
        cache_blocks: int = 50_000,
        stamp_capacity: int = 100_000,
    ) -> None:
        initial = dict(profiles) if profiles is not None else default_profiles()
        if not noise:
            initial = {name: without_noise(profile) for name, profile in initial.items()}
        self._initial = {name: copy_profile(profile) for name, profile in initial.items()}
        self.noise = noise
        self.seed = seed
        self.api_key = api_key
        self.clock = clock
        self.wall_clock = wall_clock
        self.cache_blocks = cache_blocks
        self.rng = random.Random(seed)
        self.profiles: dict[str, ModelProfile] = {}
        self.caches: dict[str, PrefixCache] = {}
        self._loads: dict[str, tuple[float, float]] = {}  # per model: AR(1) load and when it was read
        self.stamps = StampStore(capacity=stamp_capacity)
        # Not cleared by reset: a real server's counters only grow while it runs.
        self.metrics = SimMetrics()
        self.reset()

    def reset(self) -> None:
        """Back to the profiles given at start, empty caches, no stamps, the RNG reseeded."""
        self.profiles = {name: copy_profile(profile) for name, profile in self._initial.items()}
        self.caches.clear()
        self._loads.clear()
        self.stamps.clear()
        self.rng.seed(self.seed)

    def cache(self, model: str) -> PrefixCache:
        cache = self.caches.get(model)
        if cache is None:
            cache = self.caches[model] = PrefixCache(capacity_blocks=self.cache_blocks)
        return cache

    def update_profile(self, name: str, patch: Any) -> tuple[ModelProfile, bool]:
        """Apply a partial update (creating the model if new); returns (profile, created).

        In-flight requests keep the profile they started with: the entry is replaced, never mutated.
        """
        current = self.profiles.get(name)
        created = current is None
        if current is None:
            current = new_profile(name)
            if not self.noise:
                current = without_noise(current)
        updated = apply_patch(current, patch)
        self.profiles[name] = updated
        return updated, created

    def noise_factor(self, profile: ModelProfile) -> float:
        if profile.noise_sigma <= 0:
            return 1.0
        share = profile.ar_share
        if share <= 0:
            return self.rng.lognormvariate(0.0, profile.noise_sigma)
        return math.exp(self.rng.gauss(0.0, profile.noise_sigma * math.sqrt(1.0 - share)) + self._load(profile))

    def _load(self, profile: ModelProfile) -> float:
        """The model's shared AR(1) load (log units), moved on by the wall-clock time since it was last read."""
        sd = profile.noise_sigma * math.sqrt(profile.ar_share)
        now = self.wall_clock()
        level, last = self._loads.get(profile.name, (self.rng.gauss(0.0, sd), now))
        rho = float(profile.ar_phi ** (max(0.0, now - last) / profile.ar_step_s))
        level = rho * level + self.rng.gauss(0.0, sd * math.sqrt(max(0.0, 1.0 - rho * rho)))
        self._loads[profile.name] = (level, now)
        return level

    def draws_error(self, faults: Faults) -> bool:
        return faults.error_rate > 0 and self.rng.random() < faults.error_rate

    def thinks(self, profile: ModelProfile, request: SimRequest) -> bool:
        if profile.reasoning_tokens <= 0:
            return False
        return profile.thinks_by_default if request.thinking is None else request.thinking


@dataclass(slots=True)
class _Job:
    """One accepted generation request, with its timeline worked out."""

    request: web.Request
    api: Flavour
    body: SimRequest
    profile: ModelProfile
    stamp: Stamp
    plan: OutputPlan
    usage: Usage
    thinking: bool
    created: int
    first_token_ns: int
    gap_ns: int
    on_prefilled: Callable[[], None]

    def generation(self) -> Generation:
        return Generation(
            request_id=self.stamp.request_id,
            created=self.created,
            model=self.profile.served_as or self.body.model,
            fingerprint=self.profile.system_fingerprint,
            thinking=self.thinking,
            tool_call=self.body.tool_call,
            include_usage=self.body.include_usage,
            reasoning_field=self.profile.reasoning_field,
            plan=self.plan,
            usage=self.usage,
        )


def _json_response(body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers, dumps=dumps)


async def _wait_for_disconnect(request: web.Request) -> None:
    while True:
        transport = request.transport
        if transport is None or transport.is_closing():
            return
        await asyncio.sleep(HANG_POLL_S)


def _fault_at(position: int | None, total: int) -> int | None:
    """Token index at which an "after N tokens" fault fires; past the end it fires after the last token."""
    return None if position is None else min(position, total)


class _Routes:
    def __init__(self, sim: Simulator, arrivals: ArrivalStamps) -> None:
        self.sim = sim
        self.arrivals = arrivals
        self._generating: set[asyncio.Task[Any]] = set()
        self._shutting_down = False

    async def on_shutdown(self, app: web.Application) -> None:
        # Streams can run for minutes (or forever, when hanging on purpose); a simulator has no
        # answers worth waiting for, so end them now rather than after aiohttp's grace period.
        self._shutting_down = True
        for task in list(self._generating):
            task.cancel()

    # --- generation --------------------------------------------------------------------

    def generate(self, flavour: Flavour) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """The request handler for one API flavour."""

        async def handler(request: web.Request) -> web.StreamResponse:
            if not flavour.serves(Route(request.match_info, request.query)):
                raise web.HTTPNotFound()
            return await self._generate(request, flavour)

        return handler

    def _error(
        self,
        family: Family,
        stamp: Stamp,
        status: int,
        *,
        message: str | None = None,
        model: str | None = None,
    ) -> web.Response:
        stamp.status = status
        stamp.outcome = "error"
        stamp.completed_ns = self.sim.clock()
        headers = family.response_headers(stamp.request_id)
        if status == 429:
            headers["retry-after"] = "1"
        body = family.error_body(status, request_id=stamp.request_id, message=message, model=model)
        return _json_response(body, status=status, headers=headers)

    def _authorized(self, request: web.Request, family: Family) -> bool:
        key = self.sim.api_key
        return key is None or family.authorized(request.headers, request.query, key)

    async def _generate(self, request: web.Request, api: Flavour) -> web.StreamResponse:
        received_ns = self.sim.clock()
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - aiohttp always runs handlers in a task
            return await self._generate_in_task(request, api, received_ns)
        self._generating.add(task)
        try:
            return await self._generate_in_task(request, api, received_ns)
        finally:
            self._generating.discard(task)

    async def _generate_in_task(self, request: web.Request, api: Flavour, received_ns: int) -> web.StreamResponse:
        sim = self.sim
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        stamp = Stamp(request_id=request_id, api=api.name, received_ns=received_ns)
        sim.stamps.add(stamp)

        if not self._authorized(request, api.family):
            return self._error(api.family, stamp, 401)
        raw = await request.read()
        # The request counts as received when its last byte arrived (see monitor.sim.arrival);
        # served without that stamp, when its body has been read.
        arrived = self.arrivals.last_data_ns(request.protocol)
        stamp.received_ns = received_ns = arrived if arrived is not None else sim.clock()
        try:
            body = api.parse(load_json(raw), Route(request.match_info, request.query))
        except BadRequest as exc:
            return self._error(api.family, stamp, 400, message=str(exc))
        stamp.model = body.model
        stamp.stream = body.stream
        profile = sim.profiles.get(body.model)
        if profile is None:
            return self._error(api.family, stamp, 404, model=body.model)
        if body.has_stream_options and profile.reject_stream_options:
            return self._error(api.family, stamp, 400, message="stream_options: Extra inputs are not permitted")
        if sim.draws_error(profile.faults):
            return self._error(api.family, stamp, profile.faults.error_status, model=body.model)

        tokens = tokenize(body.prompt)
        hashes = block_hashes(tokens)
        cache = sim.cache(body.model)
        caching = profile.prefix_cache and body.cacheable
        cached = cache.cached_tokens(hashes) if caching else 0
        thinking = sim.thinks(profile, body)
        answer_text = profile.answer_text or ANSWER_TEXT
        if profile.answer_varies:  # a model that never answers the same twice: a word of its own first
            answer_text = f"{self.sim.rng.randrange(10**6)} {answer_text}"
        plan = plan_output(
            reasoning_tokens=profile.reasoning_tokens if thinking else 0,
            answer_tokens=profile.answer_tokens,
            max_tokens=body.max_tokens,
            answer_text=answer_text,
        )
        ttft = ttft_ms(
            profile,
            uncached_tokens=len(tokens) - cached,
            cached_tokens=cached,
            noise=sim.noise_factor(profile),
        )
        stamp.configured_ttft_ms = ttft
        stamp.prompt_tokens = len(tokens)
        stamp.cached_tokens = cached
        metrics, model = sim.metrics, body.model

        def prefilled() -> None:
            if caching:
                cache.insert(hashes)
            metrics.first_token(model, (sim.clock() - received_ns) / 1e9)

        stamp.reasoning = thinking
        job = _Job(
            request=request,
            api=api,
            body=body,
            profile=profile,
            stamp=stamp,
            plan=plan,
            usage=Usage(
                prompt_tokens=len(tokens),
                cached_tokens=cached,
                completion_tokens=plan.completion_tokens,
                reasoning_tokens=len(plan.reasoning) if profile.reports_reasoning_tokens else None,
            ),
            thinking=thinking,
            created=int(sim.wall_clock()),
            first_token_ns=received_ns + round(ttft * 1_000_000),
            gap_ns=token_gap_ns(profile),
            on_prefilled=prefilled,
        )
        metrics.arrived(model, prompt_tokens=len(tokens), cached_tokens=cached)
        try:
            if body.stream:
                return await self._stream(job)
            return await self._respond(job)
        except asyncio.CancelledError:
            self._client_gone(stamp)
            raise
        finally:
            stamp.completed_ns = sim.clock()
            metrics.finished(model)

    def _client_gone(self, stamp: Stamp) -> None:
        # A fault outcome (hang, malformed) says more than the client's leaving, which it causes.
        if stamp.outcome == "in_progress":
            stamp.outcome = "shutdown" if self._shutting_down else "client_gone"

    async def _prefill(self, job: _Job, write: Callable[[bytes], Awaitable[None]]) -> None:
        """Wait for the first-token deadline, sending `: ping` comments meanwhile if the profile asks."""
        clock = self.sim.clock
        if job.profile.comment_pings:
            next_ping = job.stamp.received_ns + PING_INTERVAL_NS
            # Stop pinging a little early so a ping never delays the first token.
            while next_ping < job.first_token_ns - 2_000_000:
                await sleep_until(next_ping, clock=clock)
                await write(COMMENT_PING)
                next_ping += PING_INTERVAL_NS
        await sleep_until_precisely(job.first_token_ns, clock=clock)

    async def _stream(self, job: _Job) -> web.StreamResponse:
        stamp = job.stamp
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                **job.api.family.response_headers(stamp.request_id),
            }
        )
        await response.prepare(job.request)  # headers go out now, before prefill
        try:
            await self._stream_events(job, response)
        except ConnectionResetError:
            # The client went away mid-stream; that is its right, not a server error.
            self._client_gone(stamp)
        return response

    async def _stream_events(self, job: _Job, response: web.StreamResponse) -> None:
        clock = self.sim.clock
        stamp = job.stamp
        faults = job.profile.faults
        wire = job.api.stream(job.generation())
        if job.profile.comment_pings:
            await response.write(COMMENT_PING)
        opening = wire.opening()
        if opening:
            stamp.first_event_write_ns = clock()
            await response.write(opening)
        if faults.hang_before_first_token:
            stamp.outcome = "hang"
            await _wait_for_disconnect(job.request)
            return

        tokens = [(False, piece) for piece in job.plan.reasoning]
        tokens += [(True, piece) for piece in job.plan.answer]
        total = len(tokens)
        cut_at = _fault_at(faults.cut_after_tokens, total)
        malformed_at = _fault_at(faults.malformed_after_tokens, total)
        error_at = _fault_at(faults.error_event_after_tokens, total)
        answering = False
        for i in range(total + 1):
            # Bytes are built before the wait so the write follows the deadline at once.
            data = b""
            is_answer = False
            if i < total:
                is_answer, piece = tokens[i]
                if not is_answer:
                    data = wire.reasoning(piece)
                elif answering:
                    data = wire.answer(piece)
                else:
                    answering = True
                    data = wire.begin_answer() + wire.answer(piece)
            if i == 0:
                await self._prefill(job, response.write)
                # The prompt's blocks count as cached once prefill ends. Deferred to the next loop
                # turn, after the first write, so inserting a long prompt never delays that write.
                asyncio.get_running_loop().call_soon(job.on_prefilled)
            elif i < total:
                await sleep_until(job.first_token_ns + i * job.gap_ns, clock=clock)

            if i == cut_at:
                stamp.outcome = "cut"
                transport = job.request.transport
                if transport is not None:
                    transport.abort()
                return
            if i == malformed_at:
                stamp.outcome = "malformed"
                await response.write(wire.malformed())
            if i == error_at:
                stamp.outcome = "error_event"
                await response.write(wire.error_event())
                return
            if i == total:
                break
            now = clock()
            if stamp.first_event_write_ns is None:
                stamp.first_event_write_ns = now
            first = stamp.first_token_write_ns is None
            if first:
                stamp.first_token_write_ns = now
            if is_answer and stamp.first_answer_write_ns is None:
                stamp.first_answer_write_ns = now
            stamp.last_token_write_ns = now
            stamp.completion_tokens = i + 1
            await response.write(data)
            if first:
                stamp.first_token_sent_ns = clock()

        await response.write(wire.closing(finished=job.plan.finished, usage=job.usage))
        if stamp.outcome == "in_progress":
            stamp.outcome = "ok"

    async def _respond(self, job: _Job) -> web.StreamResponse:
        """A non-streamed answer: the whole body once the last token would have been generated."""
        clock = self.sim.clock
        stamp = job.stamp
        faults = job.profile.faults
        if faults.hang_before_first_token:
            stamp.outcome = "hang"
            await _wait_for_disconnect(job.request)
            return web.Response(status=499)
        await sleep_until_precisely(job.first_token_ns, clock=clock)
        job.on_prefilled()
        total = job.plan.completion_tokens
        faults_at = [
            (at, name)
            for at, name in (
                (_fault_at(faults.cut_after_tokens, total), "cut"),
                (_fault_at(faults.error_event_after_tokens, total), "error_event"),
            )
            if at is not None
        ]
        if faults_at:
            at, name = min(faults_at)
            await sleep_until(job.first_token_ns + at * job.gap_ns, clock=clock)
            stamp.outcome = name
            if name == "cut":
                transport = job.request.transport
                if transport is not None:
                    transport.abort()
                return web.Response(status=499)
            response = self._error(job.api.family, stamp, 500)
            stamp.outcome = name
            return response

        await sleep_until(job.first_token_ns + max(total - 1, 0) * job.gap_ns, clock=clock)
        stamp.completion_tokens = total
        body = job.api.whole(job.generation())
        headers = job.api.family.response_headers(stamp.request_id)
        if faults.malformed_after_tokens is not None:
            stamp.outcome = "malformed"
            text = dumps(body)
            return web.Response(text=text[: len(text) // 2], content_type="application/json", headers=headers)
        stamp.outcome = "ok"
        return _json_response(body, headers=headers)

    # --- discovery ---------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        anthropic = "anthropic-version" in request.headers or "x-api-key" in request.headers
        family = anthropic_wire.FAMILY if anthropic else openai_wire.FAMILY
        if not self._authorized(request, family):
            stamp = Stamp(request_id=uuid.uuid4().hex, api="models", received_ns=self.sim.clock())
            return self._error(family, stamp, 401)
        names = sorted(self.sim.profiles)
        if anthropic:
            return _json_response(anthropic_wire.models_list(names))
        return _json_response(openai_wire.models_list(names, created=int(self.sim.wall_clock())))

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        page = self.sim.metrics.page(self.sim.profiles, self.sim.caches)
        return web.Response(body=page, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # --- control -----------------------------------------------------------------------

    def _models_json(self) -> dict[str, Any]:
        return {
            "models": {name: profile_to_dict(profile) for name, profile in sorted(self.sim.profiles.items())},
            "noise": self.sim.noise,
            "seed": self.sim.seed,
        }

    async def sim_models(self, request: web.Request) -> web.Response:
        return _json_response(self._models_json())

    async def sim_update_model(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            patch = load_json(await request.read())
            profile, created = self.sim.update_profile(name, patch)
        except (BadRequest, ProfileError) as exc:
            return _json_response({"error": f"model {name!r}: {exc}"}, status=400)
        return _json_response(profile_to_dict(profile), status=201 if created else 200)

    async def sim_reset(self, request: web.Request) -> web.Response:
        self.sim.reset()
        return _json_response(self._models_json())

    async def sim_request(self, request: web.Request) -> web.Response:
        request_id = request.match_info["request_id"]
        stamp = self.sim.stamps.get(request_id)
        if stamp is None:
            return _json_response({"error": f"unknown request id {request_id!r}"}, status=404)
        return _json_response(stamp.as_dict())


ARRIVALS = web.AppKey("sim_arrivals", ArrivalStamps)


def build_app(simulator: Simulator) -> web.Application:
    arrivals = ArrivalStamps(simulator.clock)
    routes = _Routes(simulator, arrivals)
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[ARRIVALS] = arrivals
    app.on_shutdown.append(routes.on_shutdown)
    for flavour in FLAVORS:
        for path in flavour.paths:
            app.router.add_post(path, routes.generate(flavour))
    app.router.add_get("/v1/models", routes.models)
    app.router.add_get("/health", routes.health)
    app.router.add_get("/metrics", routes.metrics)
    app.router.add_get("/sim/models", routes.sim_models)
    app.router.add_post("/sim/models/{name}", routes.sim_update_model)
    app.router.add_post("/sim/reset", routes.sim_reset)
    app.router.add_get("/sim/requests/{request_id}", routes.sim_request)
    return app


@dataclass(frozen=True, slots=True)
class RunningSimulator:
    runner: web.AppRunner
    listener: asyncio.Server
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def close(self) -> None:
        self.listener.close()
        await self.runner.cleanup()


async def start(
    simulator: Simulator,
    host: str = "127.0.0.1",
    port: int = 8400,
    *,
    shutdown_timeout: float = 3.0,
    backlog: int = 1024,
) -> RunningSimulator:
    """Serve `simulator` on host:port (port 0 picks a free one); close the result to stop."""
    app = build_app(simulator)
    # Cancelling handlers when their client disconnects frees hung and slow streams at once.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    server = runner.server
    assert server is not None  # set by setup()
    try:
        # Our own listener rather than a TCPSite, so arrivals are stamped before aiohttp parses them.
        loop = asyncio.get_running_loop()
        # Requests read with the kernel's arrival stamps where it has them (monitor/kernel_clock.py).
        stamped = KernelStampedListener.bound(host, port, backlog=backlog)
        if stamped is not None:
            listener = await loop.create_server(app[ARRIVALS].wrap(server), sock=stamped, backlog=backlog)
        else:
            listener = await loop.create_server(app[ARRIVALS].wrap(server), host, port, backlog=backlog)
    except BaseException:
        await runner.cleanup()
        raise
    bound_port = listener.sockets[0].getsockname()[1]
    return RunningSimulator(runner=runner, listener=listener, host=host, port=bound_port)


async def serve_until_signalled(simulator: Simulator, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        server = await start(simulator, host, port)
        try:
            models = ", ".join(sorted(simulator.profiles))
            noise = "on" if simulator.noise else "off"
            print(
                f"ttft-monitor simulator listening on {server.url} (models: {models}; noise {noise})",
                flush=True,
            )
            await stop.wait()
        finally:
            await server.close()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def run(
    host: str = "127.0.0.1",
    port: int = 8400,
    *,
    profiles: Mapping[str, ModelProfile] | None = None,
    noise: bool = True,
    seed: int | None = None,
    api_key: str | None = None,
) -> None:
    """Serve the simulator until SIGINT or SIGTERM."""
    simulator = Simulator(profiles, noise=noise, seed=seed, api_key=api_key)
    asyncio.run(serve_until_signalled(simulator, host, port))
