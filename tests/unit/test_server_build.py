"""What a self-hosted server says it runs (monitor/probe/server_metrics.py `server_build`) and its change as
a model change (monitor/detect/identity.py): pure code."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from monitor.detect import identity
from monitor.detect.state import RunPoint, SeriesState
from monitor.probe.server_metrics import BUILD_CAP, parse_snapshot, server_build

VLLM_METRICS = (
    'vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",'
    'gpu_memory_utilization="0.92",num_gpu_blocks="2048"} 1.0\n'
)
MODELS = {"object": "list", "data": [{"id": "tiny", "owned_by": "vllm", "root": "/w/tiny-v1", "max_model_len": 8192}]}


def test_a_vllm_says_its_version_weights_and_cache_configuration() -> None:
    build = server_build(
        version={"version": "0.32.0"}, models=MODELS, model="tiny", snapshot=parse_snapshot(VLLM_METRICS)
    )
    assert build == "vllm 0.32.0; weights /w/tiny-v1; max_model_len 8192; block 128, prefix caching True, kv auto"
    # What the server did not say is left out; nothing said at all is None.
    assert server_build(models=MODELS, model="tiny") == "weights /w/tiny-v1; max_model_len 8192"
    assert server_build(models=MODELS, model="other") is None
    assert server_build(version="0.32", models=[], model="tiny", snapshot={}) is None
    # A root equal to the id (SGLang's served path, a gateway) says nothing of the weights.
    same = {"data": [{"id": "tiny", "root": "tiny"}]}
    assert server_build(models=same, model="tiny") is None


def test_an_sglang_says_its_weights_and_their_version_at_get_model_info() -> None:
    # SGLang's /v1/models names the served id (root = id); /get_model_info names the weights behind it and
    # the version an online weight update moves (`/update_weights_from_disk`); it has no /version.
    models = {"data": [{"id": "qwen", "owned_by": "sglang", "root": "qwen", "max_model_len": 40960}]}
    info = {"model_path": "/models/Qwen3-8B", "tokenizer_path": "/models/Qwen3-8B", "weight_version": "default"}
    build = server_build(models=models, model="qwen", model_info=info)
    assert build == "weights /models/Qwen3-8B; weight_version default; max_model_len 40960"
    updated = server_build(models=models, model="qwen", model_info={**info, "weight_version": "step-1200"})
    assert updated is not None and updated != build and "weight_version step-1200" in updated
    # vLLM answers /get_model_info with 404 (None): its build reads as before.
    assert server_build(version={"version": "0.32.0"}, models=MODELS, model="tiny", model_info=None) == (
        "vllm 0.32.0; weights /w/tiny-v1; max_model_len 8192"
    )
    # The model list's root wins over model_path; odd values are ignored or cleaned.
    assert server_build(models=MODELS, model="tiny", model_info={"model_path": "/elsewhere"}) == (
        "weights /w/tiny-v1; max_model_len 8192"
    )
    odd = server_build(models=models, model="qwen", model_info={"model_path": 7, "weight_version": True})
    assert odd == "max_model_len 40960"
    assert server_build(model="qwen", model_info=["not", "a", "dict"]) is None


def test_what_a_server_chose_is_cleaned_and_capped() -> None:
    hostile = {
        "data": [{"id": "m", "owned_by": "x\x1b[31m", "root": "/w/" + "a" * 500 + "\n\x00", "max_model_len": True}]
    }
    build = server_build(version={"version": "1\r\n2"}, models=hostile, model="m")
    assert build is not None and len(build) <= BUILD_CAP
    assert "\x1b" not in build and "\n" not in build and "\x00" not in build and "max_model_len" not in build
    assert build.startswith("x[31m 12; weights /w/aaa")


def test_a_new_server_build_is_a_model_change_once_confirmed_on_two_runs() -> None:
    state = SeriesState()
    t0 = datetime(2026, 12, 3, tzinfo=UTC)
    on = "vllm 0.32.0; block 128, prefix caching True, kv auto"
    off = "vllm 0.32.0; block 128, prefix caching False, kv auto"

    def run(i: int, build: str) -> identity.IdentityChange | None:
        return identity.observe(state, RunPoint(t0 + timedelta(minutes=5 * i), 100.0, server_build=build))

    assert run(0, on) is None and run(1, on) is None
    assert run(2, off) is None  # one run of a new build is not yet a change
    change = run(3, off)
    assert change is not None and change.since == t0 + timedelta(minutes=10)
    text = identity.describe(change.detail(), "tiny")
    # Only what differs: the rest of the build is the same.
    assert (
        text
        == "model behind tiny changed: server prefix caching True -> prefix caching False; a new baseline starts here"
    )
    assert change.detail()["server_build_from"] == on and change.detail()["server_build_to"] == off
    assert identity.build_difference("vllm 0.32.0; block 128", "vllm 0.33.0; block 128") == "vllm 0.32.0 -> vllm 0.33.0"
    assert identity.build_difference(None, "vllm 0.33.0") == "-> vllm 0.33.0"
    # Builds that alternate (two replicas behind one URL) never confirm.
    assert run(4, on) is None and run(5, off) is None and run(6, on) is None
    # The state survives its JSON, the pending build included.
    again = SeriesState.from_json(state.to_json())
    assert (again.server_build, again.server_build_pending) == (state.server_build, state.server_build_pending)


def test_a_damaged_pending_build_restarts_its_confirmation() -> None:
    state = SeriesState.from_json({"server_build": "a", "server_build_pending": ["b", "not a time", 1]})
    assert state.server_build == "a" and state.server_build_pending is None and state.server_build_pending_runs == 0
    # The same parse for the fingerprint's and the canary's: a damaged one no longer fails the whole state.
    damaged = SeriesState.from_json({"fingerprint_pending": ["fp", 3, "x"], "canary_pending": "nonsense"})
    assert damaged.fingerprint_pending is None and damaged.canary_pending is None
