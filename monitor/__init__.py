"""ttft-monitor: watches how fast LLM endpoints start answering."""

import sys as _sys

__version__ = "0.1.0"


def _import_structlog_without_rich() -> None:
    """Import structlog as the image has it: without rich.

    structlog.dev imports rich, when it is installed, for coloured tracebacks at a terminal; rich comes
    with import-linter, a development tool, and is not in the image. Importing it (with pygments) costs
    15-20 ms of every start, `once`'s included, before its first request. Here structlog sees it as absent,
    so the console renderer prints tracebacks as it does in the image; rich itself stays importable.
    """
    if "structlog" in _sys.modules or "rich" in _sys.modules:
        return
    _sys.modules["rich"] = None  # type: ignore[assignment]  # `import rich` raises ImportError
    try:
        import structlog  # noqa: F401
    finally:
        if _sys.modules.get("rich", ...) is None:
            del _sys.modules["rich"]


_import_structlog_without_rich()
