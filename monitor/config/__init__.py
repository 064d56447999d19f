"""Typed configuration: models, loading with `${ENV}` expansion, errors that carry the key path."""

from monitor.config.check import check_config
from monitor.config.cron import build_trigger, next_fire_times
from monitor.config.errors import ConfigError, ConfigIssue
from monitor.config.loader import load_config
from monitor.config.models import (
    Alerts,
    Availability,
    Config,
    Database,
    Detection,
    Job,
    MetricsSettings,
    Params,
    PromptProfile,
    Provider,
    Receiver,
    Retention,
    Route,
    SeverityRule,
    Silence,
    Slo,
    Target,
    TimeoutSettings,
    Tls,
)

__all__ = [
    "Alerts",
    "Availability",
    "Config",
    "ConfigError",
    "ConfigIssue",
    "Database",
    "Detection",
    "Job",
    "MetricsSettings",
    "Params",
    "PromptProfile",
    "Provider",
    "Receiver",
    "Retention",
    "Route",
    "SeverityRule",
    "Silence",
    "Slo",
    "Target",
    "TimeoutSettings",
    "Tls",
    "build_trigger",
    "check_config",
    "load_config",
    "next_fire_times",
]
