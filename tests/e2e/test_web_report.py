"""Reports: `probe --report` for an ad-hoc run, `report` from the store with the compare view's numbers."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import pytest

from monitor.store.repository import Repository
from monitor.web import queries
from monitor.web.report import render
from tests.conftest import SimProcess, run_cli
from tests.support.config import build_config, write_yaml
from tests.support.store_fixtures import T0, Backend, make_batch

pytest_plugins = ("tests.support.store_fixtures",)
SEED_MODELS = ("qwen3-8b", "qwen3-14b", "gpt-4o-mini")


def _sim_config(path: Path, sim_url: str, database_url: str = "sqlite+aiosqlite:///unused.db") -> Path:
    targets = {name: {"model": name, "params": {"max_tokens": 4}} for name in SEED_MODELS}
    return write_yaml(path, build_config(f"{sim_url}/v1", targets=targets, database_url=database_url))


@pytest.mark.realtime
def test_probe_report_ranks_the_seed_models_by_prefill_slope(tmp_path: Path, exact_sim: SimProcess) -> None:
    config = _sim_config(tmp_path / "c.yaml", exact_sim.url)
    report = tmp_path / "adhoc.json"
    result = run_cli(
        "probe", "--config", str(config), *[f"--target={m}" for m in SEED_MODELS], "--prompt-tokens", "256,4096",
        "--rounds", "3", "--warmup", "0", "--pause", "0", "--report", str(report),
    )  # fmt: skip
    assert result.code == 0, str(result)
    data = json.loads(report.read_text())
    # 256 and 4,096 tokens, three rounds a cell: the slopes (90 and 125 ms per 1K) stay apart by 134 ms
    # at 4K, and a cell's median ignores one round slowed by a loaded machine.
    assert [s["target"] for s in data["slopes"]] == ["gpt-4o-mini", "qwen3-8b", "qwen3-14b"]
    slopes = {s["target"]: s["ms_per_1k_tokens"] for s in data["slopes"]}
    assert slopes["qwen3-14b"] == pytest.approx(125, rel=0.15) and slopes["gpt-4o-mini"] == pytest.approx(20, abs=10)
    assert len(data["cells"]) == 6 and all(c["n"] == 3 for c in data["cells"])
    html_report = tmp_path / "adhoc.html"
    result = run_cli(
        "probe", "--config", str(config), "--target=qwen3-8b", "--prompt-tokens", "256", "--rounds", "1",
        "--warmup", "0", "--report", str(html_report),
    )  # fmt: skip
    assert result.code == 0, str(result)
    text = html_report.read_text()
    assert (
        "uPlot" in text and 'id="report-data"' in text and "http" not in text.split("<body>")[1].split("report-data")[0]
    )


async def test_report_has_the_numbers_of_the_compare_view(backend: Backend, tmp_path: Path) -> None:
    repository = Repository(backend.engine())
    try:
        for step in range(12):
            await repository.save_runs(make_batch(T0 + timedelta(minutes=5 * step)))
        since = datetime.now(UTC) - T0 + timedelta(days=1)
        expected = await queries.compare(repository.engine, start=T0 - timedelta(days=1), end=datetime.now(UTC))
    finally:
        await repository.engine.dispose()
    config = tmp_path / "c.yaml"
    config.write_text(f'database:\n  url: "{backend.url}"\n')
    result = run_cli("report", "--config", str(config), "--since", f"{since.days}d", "--format", "json")
    assert result.code == 0, str(result)
    got = json.loads(result.stdout)
    for key in ("cells", "pairs", "slopes"):
        assert got[key] == expected[key]
    markdown = run_cli("report", "--config", str(config), "--since", f"{since.days}d", "--format", "md",
                       "--prompt", "short", "-o", str(tmp_path / "r.md"))  # fmt: skip
    assert markdown.code == 0, str(markdown)
    text = (tmp_path / "r.md").read_text()
    assert "| qwen3-8b | Qwen/Qwen3-8B | short |" in text and "| long |" not in text
    # A name no stored series has is a typo: exit 2 naming what is stored, not an empty report.
    typo = run_cli("report", "--config", str(config), "--since", f"{since.days}d", "-t", "qwen3-8bb", "-t", "qwen3-8b")
    assert typo.code == 2 and typo.stdout == "", str(typo)
    assert typo.stderr.startswith(
        "ttft-monitor report: --target qwen3-8bb: no stored series has this target (stored: "
    ), str(typo)
    assert "qwen3-8b" in typo.stderr.split("(stored: ")[1], str(typo)


def test_report_escapes_names_in_every_format() -> None:
    evil = '<script>alert("x")</script>\'"'
    # Rendering reads no filters or available names, so the document leaves them out (hence the cast).
    data = cast(
        queries.CompareDocument,
        {
            "start": "a",
            "end": "b",
            **queries.compare_values([(evil, evil, "p", 100.0, 10.0), (evil, evil, "p", 120.0, 20.0)]),
        },
    )
    page = render(data, "html")
    assert "<script>alert" not in page
    assert evil not in render(data, "md")
    assert json.loads(render(data, "json"))["cells"][0]["target"] == evil


def test_a_hostile_model_name_in_the_markdown_report_is_text_not_an_image() -> None:
    # A served model named like an image would make every reader's viewer fetch it from the attacker.
    image, html_tag = "![x](http://evil.example/x.png)", "<img src=x onerror=alert(1)>"
    rows = [("qwen3-8b", image, "short|long", 100.0, 10.0), ("qwen3-8b", image, "short|long", 120.0, 20.0)]
    rows += [(html_tag, "gpt-4o-mini", "short|long", 300.0, 10.0), (html_tag, "gpt-4o-mini", "short|long", 320.0, 20.0)]
    document = cast(queries.CompareDocument, {"start": "a", "end": "b", **queries.compare_values(rows)})  # as above
    text = render(document, "md", title="TTFT **comparison**")
    lines = text.splitlines()
    assert lines[0] == r"# TTFT \*\*comparison\*\*"
    assert r"| qwen3-8b | \![x\]\(http://evil.example/x.png) | short\|long | 15 | 2 | 110 | 100 – 120 | 118 |" in lines
    assert (
        "| &lt;img src=x onerror=alert(1)&gt; | gpt-4o-mini | short\\|long | 15 | 2 | 310 | 300 – 320 | 318 |" in lines
    )
    assert (
        "- short|long: **qwen3-8b** is faster than **&lt;img src=x onerror=alert(1)&gt;** by 200 ms "
        "(95% interval 176 – 224), significant"
    ) in lines
    assert "](" not in text and "<img" not in text
    # Ordinary names are left as they are.
    assert "| gpt-4o-mini |" in text and "| qwen3-8b |" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "forever"], "since='forever' is not a duration"),
        (["--format", "pdf"], "invalid choice"),
    ],
)
def test_report_refuses_bad_options_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f'database:\n  url: "sqlite+aiosqlite:///{tmp_path}/x.db"\n')
    result = run_cli("report", "--config", str(config), *args)
    assert result.code == 2 and message in result.stderr and "Traceback" not in result.stderr
