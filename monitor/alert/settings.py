"""The `alerts` config section: receivers, routes, silences and grouping. The root `Config`
(monitor/config/models.py) composes it."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PrivateAttr, field_serializer, field_validator, model_validator

from monitor.alert.model import Severity
from monitor.alert.receivers import KINDS
from monitor.config.fields import (
    ConfigModel,
    CronExpression,
    EnvName,
    Headers,
    Name,
    TimezoneName,
    UserPath,
    masked_headers,
)
from monitor.config.urls import check_http_url
from monitor.probe.proxy import ProxySettings

# The allowed values come from the registry, so a new receiver is one module and one registry line;
# pydantic still reports "not one of ..." with the full list, in registry order. The receivers type
# what they read of this section as `receivers.base.Receiver`, so they never import it back.
# mypy cannot read a Literal built at run time, hence the plain `str` it sees.
if TYPE_CHECKING:
    ReceiverType = str
else:
    ReceiverType = Literal[tuple(KINDS)]


class Receiver(ConfigModel):
    type: ReceiverType = Field(description="Kind of destination.")
    url: str | None = Field(None, description="Destination URL. Webhook URLs are often secrets: prefer `url_env`.")
    url_env: EnvName = Field(None, description="Name of the environment variable holding the URL.")
    secret_env: EnvName = Field(
        None,
        description="Name of the environment variable holding the receiver's secret (PagerDuty routing key, "
        "signing secret, bearer token). `NAME_FILE` works as for providers.",
    )
    secret_file: UserPath | None = Field(None, description="File holding the receiver's secret.")
    headers: Headers = Field(default_factory=dict, description="Extra HTTP headers; values may use `${VAR}`.")
    timeout_s: float = Field(10, gt=0, le=300, description="Seconds allowed per delivery attempt.")
    proxy: ProxySettings = Field(default_factory=ProxySettings, description="Forward proxy for deliveries.")

    _secret: str | None = PrivateAttr(default=None)
    _resolved_url: str | None = PrivateAttr(default=None)

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        return None if url is None else check_http_url(url, example="https://hooks.example.com/ttft")

    @model_validator(mode="after")
    def _check_exclusive(self) -> Receiver:
        if self.url is not None and self.url_env is not None:
            raise ValueError("set either url or url_env, not both")
        if self.secret_env is not None and self.secret_file is not None:
            raise ValueError("set either secret_env or secret_file, not both")
        return self

    def secret(self) -> str | None:
        """The secret resolved by `load_config`, or None."""
        return self._secret

    def resolved_url(self) -> str | None:
        """`url`, or the value of `url_env` as resolved by `load_config`."""
        return self._resolved_url if self._resolved_url is not None else self.url

    def with_secrets(self, *, secret: str | None, url: str | None) -> Receiver:
        copy = self.model_copy()
        copy._secret = secret
        copy._resolved_url = url
        return copy

    @field_serializer("headers")
    def _dump_headers(self, headers: dict[str, str]) -> dict[str, str]:
        return masked_headers(headers)

    @field_serializer("url")
    def _dump_url(self, url: str | None) -> str | None:
        return None if url is None else "***"

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            if name == "headers":
                yield name, masked_headers(value)
            elif name == "url" and value is not None:
                yield name, "***"
            else:
                yield name, value


def _paged_severities() -> list[Severity]:
    return ["page", "ticket"]


class Route(ConfigModel):
    receivers: list[str] = Field(min_length=1, description="Receivers to notify, by name.")
    severities: list[Severity] = Field(
        default_factory=_paged_severities, min_length=1, description="Severities this route takes."
    )
    jobs: list[str] = Field(default_factory=list, description="Only alerts from these jobs; empty means all jobs.")


class Silence(ConfigModel):
    targets: list[str] = Field(default_factory=list, description="Targets silenced; empty silences everything.")
    start: datetime | None = Field(None, description="Start of a one-off window, with UTC offset.")
    end: datetime | None = Field(None, description="End of a one-off window, with UTC offset.")
    cron: CronExpression | None = Field(
        None, description="Start of a recurring window, as a cron expression (needs `duration_s`)."
    )
    duration_s: float | None = Field(
        None, gt=0, le=366 * 86400, description="Length of each recurring window in seconds."
    )
    timezone: TimezoneName = Field("UTC", description="IANA timezone `cron` is read in.")
    comment: str = Field("", description="Why; shown with suppressed alerts.")

    @field_validator("start", "end")
    @classmethod
    def _check_aware(cls, moment: datetime | None) -> datetime | None:
        if moment is not None and moment.tzinfo is None:
            raise ValueError(f"{moment.isoformat()} has no UTC offset; write e.g. {moment.isoformat()}+00:00")
        return moment

    @model_validator(mode="after")
    def _check_window(self) -> Silence:
        one_off = self.start is not None or self.end is not None
        recurring = self.cron is not None or self.duration_s is not None
        if one_off == recurring:
            raise ValueError("a silence needs either start and end, or cron and duration_s")
        if one_off and (self.start is None or self.end is None):
            raise ValueError("a one-off silence needs both start and end")
        if recurring and (self.cron is None or self.duration_s is None):
            raise ValueError("a recurring silence needs both cron and duration_s")
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise ValueError("end must be after start")
        return self


class Grouping(ConfigModel):
    """One page per outage (docs/alerting.md, "One page per outage")."""

    enabled: bool = Field(
        True,
        description="Regressions of several series behind one provider that open within `window_minutes` of each "
        "other are notified as one group naming its members (one PagerDuty dedup key, one Alertmanager alert); "
        "false notifies every series on its own.",
    )
    window_minutes: float = Field(
        15,
        gt=0,
        le=1440,
        description="A regression joins its provider's open group when the group's last member opened at most this "
        "many minutes before; later, it starts a new group.",
    )
    by: Literal["provider", "location"] = Field(
        "provider",
        description="What one outage is: regressions of series behind one `provider` (any location), or of "
        "series seen from one `location` (any provider: that location's network or egress).",
    )
    hold_minutes: float = Field(
        10,
        ge=0,
        le=1440,
        description="A group's first notification waits while other series of the provider have begun confirming a "
        "regression (they are a run or two from joining), at most this many minutes after it opened; a lone "
        "regression goes out at once. 0: never wait.",
    )


class Alerts(ConfigModel):
    base_url: str | None = Field(
        None,
        description="Public URL of your dashboard, used for links in notifications; for the built-in status "
        "pages, their series page (`http://HOST:9464/series`), which links open at the incident's time.",
    )
    renotify_interval_s: float = Field(
        14400,
        ge=0,
        le=30 * 86400,
        description="Repeat an open incident's notification this often (0 = never).",
    )
    send_resolved: bool = Field(True, description="Also notify when an incident clears.")
    receivers: dict[Name, Receiver] = Field(default_factory=dict, description="Notification destinations, by name.")
    routes: list[Route] = Field(default_factory=list, description="Which alerts go to which receivers.")
    silences: list[Silence] = Field(default_factory=list, description="Windows in which alerts are suppressed.")
    grouping: Grouping = Field(default_factory=Grouping, description="One notification per outage.")

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, url: str | None) -> str | None:
        return None if url is None else check_http_url(url, example="https://grafana.example.com/d/ttft")
