"""The saved calibration as `once` reads it before its first request, without SQLAlchemy
(monitor.store.saved_calibration): the very fits the repository loads, on both backends, and None
(the store is then opened first, as before) whenever it cannot read them so."""

from __future__ import annotations

from pathlib import Path

from monitor.store.repository import Repository
from monitor.store.saved_calibration import read_saved_calibration
from tests.support.ports import free_port
from tests.support.store_fixtures import Backend

pytest_plugins = ("tests.support.store_fixtures",)


async def test_the_saved_calibration_read_without_the_store_is_the_repositorys(backend: Backend) -> None:
    engine = backend.engine()
    try:
        repository = Repository(engine)
        assert await read_saved_calibration(backend.url, timeout_s=5) == {}
        await repository.save_calibration(("qwen3-8b", "short"), 3.7, 12.0)
        await repository.save_calibration(("qwen3-8b", "long"), 4.1, 0.0)
        await repository.save_calibration(("qwen3-8b", "short"), 1 / 3, 11.5)  # refit, a float without a short form
        loaded = await repository.load_calibration()
    finally:
        await engine.dispose()
    read = await read_saved_calibration(backend.url, timeout_s=5)
    assert read == loaded == {("qwen3-8b", "short"): (1 / 3, 11.5), ("qwen3-8b", "long"): (4.1, 0.0)}


async def test_a_database_without_the_table_reads_as_unknown(empty_backend: Backend) -> None:
    engine = empty_backend.engine()  # creates the SQLite file (and its folder); PostgreSQL's is there
    try:
        async with engine.connect():
            pass
    finally:
        await engine.dispose()
    assert await read_saved_calibration(empty_backend.url, timeout_s=5) is None


async def test_what_it_cannot_read_so_is_left_to_the_store(tmp_path: Path) -> None:
    unknown = [
        f"sqlite+aiosqlite:///{tmp_path}/missing.db",  # no file: the engine creates it, and says the schema is empty
        "sqlite+aiosqlite:///:memory:",
        f"sqlite+aiosqlite:///file:{tmp_path}/x.db?mode=ro&uri=true",
        f"postgresql+asyncpg://monitor:secret@127.0.0.1:{free_port()}/ttft",  # refused
        "mysql+aiomysql://localhost/ttft",
    ]
    for url in unknown:
        assert await read_saved_calibration(url, timeout_s=2) is None, url
    assert not (tmp_path / "missing.db").exists()
