"""A streaming LLM endpoint simulator (vLLM/OpenAI and Anthropic) with controllable latency."""

from monitor.sim.profiles import Faults, ModelProfile, default_profiles
from monitor.sim.server import RunningSimulator, Simulator, build_app, run, start

__all__ = [
    "Faults",
    "ModelProfile",
    "RunningSimulator",
    "Simulator",
    "build_app",
    "default_profiles",
    "run",
    "start",
]
