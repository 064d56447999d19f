"""The daemon's run path in-process for a test: a config's store, job context, detection and first job's plan,
opened as `run` opens them (monitor.app) and closed in reverse, so a test can execute runs one by one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitor.app import attach_detection, build_context, open_store
from monitor.config.loader import load_config
from monitor.config.models import Config
from monitor.probe.runner import RunPlan
from monitor.schedule.pipeline import JobContext, plan_for_job
from tests.conftest import run_cli


@dataclass
class Pipeline:
    config: Config
    store: Any  # monitor.app's opened store: its engine and spool
    context: JobContext
    plan: RunPlan
    dispatcher: Any  # the alert dispatcher when detection is attached, else None


@asynccontextmanager
async def job_pipeline(path: Path, *, detection: bool = True) -> AsyncIterator[Pipeline]:
    """The schema upgraded with the real CLI, then the pipeline of the config at `path`."""
    upgraded = await asyncio.to_thread(run_cli, "db", "upgrade", "--config", str(path))
    assert upgraded.code == 0, str(upgraded)
    config = load_config(str(path))
    async with AsyncExitStack() as stack:
        store = await open_store(config, metrics=None)
        stack.callback(store.spool.close)
        stack.push_async_callback(store.engine.dispose)
        context = await build_context(config, stack, store=store, metrics=None)
        dispatcher = None
        if detection:
            dispatcher, _service = await attach_detection(context, store, stack, metrics=None)
        yield Pipeline(config, store, context, plan_for_job(context, config.jobs[0]), dispatcher)
