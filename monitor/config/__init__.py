"""Typed configuration: the root model (`models.py`) composing each stage's section, the field types
they share (`fields.py`), loading with `${ENV}` expansion (`loader.py`), errors that carry the key path.

Nothing is imported here, so `import monitor.config.urls` loads only that module: import what you use
from its module (`from monitor.config.loader import load_config`)."""
