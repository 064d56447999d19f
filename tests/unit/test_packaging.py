"""What `pip install .` ships: every package, and the migrations inside it."""

from __future__ import annotations

import tomllib

from tests.conftest import ROOT


def declared() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_under_monitor_is_declared() -> None:
    found = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "monitor").rglob("__init__.py")
        if "__pycache__" not in path.parts
    }
    assert found - set(declared()["packages"]) == set()


def test_the_migrations_install_inside_the_package() -> None:
    settings = declared()
    assert settings["package-dir"]["monitor._migrations"] == "migrations"
    assert {"monitor._migrations", "monitor._migrations.versions"} <= set(settings["packages"])
    assert (ROOT / "migrations" / "env.py").is_file()
    assert "alembic.ini" in settings["package-data"]["monitor._migrations"]
