"""ttft-monitor: watches how fast LLM endpoints start answering."""

__version__ = "0.1.0"
