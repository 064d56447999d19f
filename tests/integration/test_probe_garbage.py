"""A probe leaves no cyclic garbage: what it made is freed by reference counting as it ends.

The daemon counts on it (issue 26, the daemon's own cost): it keeps the collector's full collections rare
(`app.COLLECTOR_THRESHOLDS`), so cyclic garbage made per probe would pile up in the oldest generation
between them and be walked by the young collections on its way there. A closure in `Body.read` that
referred to itself held each probe's body, reader, parser and stream in a cycle: about 20 objects a probe,
1,100 a second at 500 series. The simulator runs in its own process, so what its server makes is not
counted here.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import yarl

from monitor.probe.apis import FLAVORS, RequestParams
from monitor.probe.client import Endpoint, ProbeClient
from monitor.probe.result import ErrorClass, Sample
from tests.conftest import SimProcess

PARAMS = RequestParams(model="garbage-model", max_tokens=8, temperature=0.0, extra_body={}, include_usage=True)


def sample() -> Sample:
    return Sample(target="t", model="garbage-model", api="openai-chat", prompt="p", round=1)


@pytest.fixture
def saved_garbage() -> Iterator[list[object]]:
    """Everything the collector finds unreachable from here on, kept (DEBUG_SAVEALL) rather than freed."""
    gc.collect()
    gc.garbage.clear()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _not_yarls_own(garbage: list[object]) -> list[object]:
    """`garbage` without yarl's own cycles: a URL that is its own origin caches itself as such
    (`URL._cache["_origin"]` is the URL), and becomes garbage when yarl's cache of parsed URLs evicts it, at any
    time after many URLs (in a test worker, an earlier test's URL). Not made by a probe."""
    own = [o for o in garbage if isinstance(o, yarl.URL) and o._cache.get("_origin") is o]
    left_out = {id(url) for url in own} | {id(url._cache) for url in own}
    return [o for o in garbage if id(o) not in left_out]


@pytest.mark.parametrize("kernel_stamps", [True, False], ids=["kernel-stamps", "stamped-by-protocol"])
async def test_probes_on_a_kept_connection_leave_no_cyclic_garbage(
    exact_sim: SimProcess, kernel_stamps: bool, request: pytest.FixtureRequest
) -> None:
    exact_sim.post("/sim/models/garbage-model", {"ttft_base_ms": 20, "prefill_ms_per_1k": 0, "decode_tps": 500})
    endpoint = Endpoint(exact_sim.v1, FLAVORS["openai-chat"])
    missing = Endpoint(exact_sim.v1 + "/missing", FLAVORS["openai-chat"])
    async with ProbeClient(kernel_stamps=kernel_stamps) as client:
        first = await client.probe(endpoint, PARAMS, "hello", sample())  # the connection's own objects
        assert first.ok, first.error_message
        garbage: list[object] = request.getfixturevalue("saved_garbage")
        samples = [await client.probe(endpoint, PARAMS, "hello", sample()) for _ in range(5)]
        failed = await client.probe(missing, PARAMS, "hello", sample())
        gc.collect()
        ours = _not_yarls_own(garbage)
        kinds = sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in ours})
        found = len(ours)
    assert all(s.ok and s.ttft_ms is not None for s in samples), [s.error_message for s in samples]
    assert failed.error is ErrorClass.MODEL_NOT_FOUND, failed.error_message
    assert found == 0, f"{found} objects in reference cycles after 6 probes: {kinds}"


def test_only_yarls_self_origin_cycle_is_left_out(saved_garbage: list[object]) -> None:
    own = yarl.URL("http://127.0.0.1:8123")
    own.origin()  # cached as its own origin: a URL and its cache in a cycle
    yarls = {id(own), id(own._cache)}
    del own
    for number in range(5000):  # evicts it from yarl's cache of parsed URLs
        yarl.URL(f"http://h{number}.example:1/")
    ours: dict[str, dict[str, object]] = {"cycle": {}}
    ours["cycle"]["back"] = ours  # a cycle of ours beside it
    mine = {id(ours), id(ours["cycle"])}
    del ours
    gc.collect()
    found = {id(o) for o in saved_garbage}
    assert yarls <= found and mine <= found  # both cycles were garbage
    left = {id(o) for o in _not_yarls_own(saved_garbage)}
    assert mine <= left and not yarls & left
