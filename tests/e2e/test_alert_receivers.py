"""Every receiver through the real delivery path to a real HTTP server on loopback, which checks what
it gets the way the real service would: signatures recomputed here, independently of the code."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import standardwebhooks
from structlog.testing import capture_logs

from monitor.alert.deliver import deliver
from monitor.alert.receivers import KINDS
from monitor.alert.settings import Receiver
from monitor.alert.transport import SendResult, Transport
from tests.conftest import run_cli
from tests.support.alert_fixtures import (
    INCIDENT,
    T0,
    Loopback,
    Received,
    Reply,
    dingtalk_sign,
    feishu_sign,
    notification,
    receiver,
    standard_webhook_problem,
)

pytest_plugins = ("tests.support.alert_fixtures",)

NOW = T0 + timedelta(minutes=20)
# The Standard Webhooks spec's published test vector (split so secret scanners do not flag it).
WHSEC = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
WRONG_WHSEC = "whsec_" + "bm90IHRoZSBzZWNyZXQgdGhlIGhvb2sgZXhwZWN0cyE="


async def send(r: Receiver, name: str = "r", **changes: object) -> SendResult:
    async with Transport() as transport:
        return await deliver(notification(**changes), name, r, transport=transport, now=NOW)


def expected_body(r: Receiver, **changes: object) -> object:
    request = KINDS[r.type].build(notification(**changes), r, NOW)
    assert request is not None
    return json.loads(request.body)


async def test_webhook_arrives_signed_and_the_receiver_verifies_it(loopback: Loopback) -> None:
    loopback.verify("/hook", lambda item: standard_webhook_problem(WHSEC, item))
    r = receiver("webhook", loopback.url("/hook"), secret=WHSEC)
    result = await send(r)
    assert result.ok, result.describe()
    (item,) = loopback.at("/hook")
    assert item.headers["content-type"] == "application/json"
    assert item.headers["webhook-id"] == notification().message_id()
    assert item.headers["webhook-timestamp"] == str(int(NOW.timestamp()))
    assert item.json() == expected_body(r)
    assert item.json()["data"]["incident_id"] == str(INCIDENT)


async def test_a_webhook_signed_with_the_wrong_secret_is_refused_permanently(loopback: Loopback) -> None:
    loopback.verify("/hook", lambda item: standard_webhook_problem(WHSEC, item))
    result = await send(receiver("webhook", loopback.url("/hook"), secret=WRONG_WHSEC))
    assert (result.outcome, result.status, result.detail) == ("permanent", 401, "signature mismatch")


def official_library_problem(secret: str, item: Received) -> str | None:
    """The official Standard Webhooks package's verdict (it also checks the timestamp is recent)."""
    try:
        standardwebhooks.Webhook(secret).verify(item.body, item.headers)
    except standardwebhooks.webhooks.WebhookVerificationError as exc:
        return str(exc)
    return None


def new_secret_from_the_cli() -> str:
    result = run_cli("alert", "new-secret", timeout=30)
    assert result.code == 0, result
    return result.stdout.strip()


async def test_the_official_standard_webhooks_library_verifies_real_notifications(loopback: Loopback) -> None:
    secret = new_secret_from_the_cli()
    loopback.verify("/hook", lambda item: official_library_problem(secret, item))
    r = receiver("webhook", loopback.url("/hook"), secret=secret)
    now = datetime.now(UTC)  # the library refuses timestamps more than 5 minutes off
    firing = notification()
    resolved = firing.with_changes(state="resolved", resolved_at=now)
    async with Transport() as transport:
        for n in (firing, resolved):
            result = await deliver(n, "r", r, transport=transport, now=now)
            assert result.ok, result.describe()
    assert [item.json()["type"] for item in loopback.at("/hook")] == ["incident.firing", "incident.resolved"]
    # The same check refuses a notification signed with another secret, so passing above means something.
    other = receiver("webhook", loopback.url("/hook"), secret=new_secret_from_the_cli())
    async with Transport() as transport:
        refused = await deliver(firing, "r", other, transport=transport, now=now)
    assert (refused.outcome, refused.status) == ("permanent", 401), refused.describe()


def test_new_secret_prints_a_fresh_whsec_secret_of_32_random_bytes() -> None:
    first, second = new_secret_from_the_cli(), new_secret_from_the_cli()
    assert first != second
    for secret in (first, second):
        assert secret.startswith("whsec_")
        assert len(base64.b64decode(secret.removeprefix("whsec_"), validate=True)) == 32


async def test_a_plain_webhook_secret_is_never_sent_unverifiable(loopback: Loopback) -> None:
    # Signed with its UTF-8 bytes, the official libraries could not verify it: refused without sending.
    result = await send(receiver("webhook", loopback.url("/hook"), secret="a-plain-shared-secret"))
    assert result.outcome == "permanent", result.describe()
    assert "whsec_" in result.detail and "ttft-monitor alert new-secret" in result.detail
    assert loopback.at("/hook") == []


async def test_a_retry_carries_the_same_webhook_id(loopback: Loopback) -> None:
    r = receiver("webhook", loopback.url("/hook"), secret=WHSEC)
    await send(r)
    await send(r)
    first, second = loopback.at("/hook")
    assert first.headers["webhook-id"] == second.headers["webhook-id"]


async def test_slack(loopback: Loopback) -> None:
    r = receiver("slack", loopback.url("/services/T000/B000/XXXXXXXXXXXXXXXXXXXXXXXX"))
    loopback.script("/services/T000/B000/XXXXXXXXXXXXXXXXXXXXXXXX", Reply(200, "ok"))
    result = await send(r)
    assert (result.outcome, result.detail) == ("ok", "ok")
    (item,) = loopback.received
    assert item.json() == expected_body(r)
    assert item.json()["blocks"][0]["text"]["text"].startswith("[PAGE] TTFT regression on qwen3-8b")


async def test_slack_says_why_it_refuses(loopback: Loopback) -> None:
    loopback.script("/services/x", Reply(404, "no_service"))
    result = await send(receiver("slack", loopback.url("/services/x")))
    assert result.describe() == "HTTP 404 (permanent): no_service"


def pagerduty_check(routing_key: str):  # type: ignore[no-untyped-def]
    def check(item: Received) -> str | None:
        body = item.json()
        if body.get("routing_key") != routing_key:
            return "Invalid routing key"
        if body.get("dedup_key") != f"ttft-monitor/{INCIDENT}":
            return "unexpected dedup_key"
        return None

    return check


async def test_pagerduty_trigger_then_resolve_share_the_dedup_key(loopback: Loopback) -> None:
    key = "R0UTINGKEY00000000000000000000ab"
    loopback.verify("/v2/enqueue", pagerduty_check(key))
    loopback.script("/v2/enqueue", Reply(202, {"status": "success", "message": "Event processed", "dedup_key": "x"}))
    r = receiver("pagerduty", loopback.url("/v2/enqueue"), secret=key)
    assert (await send(r)).ok
    assert (await send(r, state="resolved", resolved_at=NOW)).ok
    trigger, resolve = loopback.at("/v2/enqueue")
    assert trigger.json() == expected_body(r)
    assert resolve.json() == {"routing_key": key, "event_action": "resolve", "dedup_key": f"ttft-monitor/{INCIDENT}"}


async def test_pagerduty_never_shows_the_routing_key_in_an_error(loopback: Loopback) -> None:
    key = "R0UTINGKEY00000000000000000000ab"
    loopback.script("/v2/enqueue", Reply(400, f'{{"status":"invalid event","errors":["bad key {key}"]}}'))
    result = await send(receiver("pagerduty", loopback.url("/v2/enqueue"), secret=key))
    assert result.outcome == "permanent" and key not in result.detail


async def test_pagerduty_rate_limit_is_transient(loopback: Loopback) -> None:
    loopback.script("/v2/enqueue", Reply(429, "rate limited", {"Retry-After": "30"}))
    result = await send(receiver("pagerduty", loopback.url("/v2/enqueue"), secret="K3Y-000000"))
    assert (result.outcome, result.retry_after_s) == ("transient", 30.0)


async def test_feishu_signed(loopback: Loopback) -> None:
    secret = "feishu-bot-secret"
    r = receiver("feishu", loopback.url("/open-apis/bot/v2/hook/abc"), secret=secret)
    loopback.script("/open-apis/bot/v2/hook/abc", Reply(200, {"code": 0, "msg": "success", "data": {}}))
    assert (await send(r)).ok
    (item,) = loopback.received
    body = item.json()
    assert body["timestamp"] == str(int(NOW.timestamp()))
    assert body["sign"] == feishu_sign(secret, body["timestamp"])
    assert body == expected_body(r)


async def test_feishu_refusing_inside_a_200_is_a_permanent_failure(loopback: Loopback) -> None:
    loopback.script(
        "/open-apis/bot/v2/hook/abc",
        Reply(200, {"code": 19021, "msg": "sign match fail or timestamp is not within one hour from current time"}),
    )
    result = await send(receiver("feishu", loopback.url("/open-apis/bot/v2/hook/abc"), secret="wrong"))
    assert (result.outcome, result.status) == ("permanent", 200)
    assert result.detail.startswith("error code 19021: sign match fail")


async def test_dingtalk_signed_in_the_query(loopback: Loopback) -> None:
    secret = "SECb1f0c0ffee0123456789"

    def check(item: Received) -> str | None:
        if item.query.get("access_token") != "tok-123":
            return "token missing"
        if item.query.get("sign") != dingtalk_sign(secret, item.query.get("timestamp", "")):
            return "sign not match"
        return None

    loopback.verify("/robot/send", check)
    loopback.script("/robot/send", Reply(200, {"errcode": 0, "errmsg": "ok"}))
    r = receiver("dingtalk", loopback.url("/robot/send?access_token=tok-123"), secret=secret)
    result = await send(r)
    assert result.ok, result.describe()
    (item,) = loopback.received
    assert item.query["timestamp"] == str(int(NOW.timestamp() * 1000))
    assert item.json() == expected_body(r)


async def test_dingtalk_too_fast_is_transient(loopback: Loopback) -> None:
    loopback.script(
        "/robot/send", Reply(200, {"errcode": 130101, "errmsg": "send too fast, exceed 20 times per minute"})
    )
    result = await send(receiver("dingtalk", loopback.url("/robot/send?access_token=t")))
    assert (result.outcome, result.detail) == (
        "transient",
        "error code 130101: send too fast, exceed 20 times per minute",
    )


async def test_wecom(loopback: Loopback) -> None:
    loopback.script("/cgi-bin/webhook/send", Reply(200, {"errcode": 0, "errmsg": "ok"}))
    r = receiver("wecom", loopback.url("/cgi-bin/webhook/send?key=693a91f6-7xxx"))
    assert (await send(r)).ok
    (item,) = loopback.received
    assert item.query == {"key": "693a91f6-7xxx"}
    assert item.json() == expected_body(r)


async def test_wecom_invalid_key_is_permanent(loopback: Loopback) -> None:
    loopback.script("/cgi-bin/webhook/send", Reply(200, {"errcode": 93000, "errmsg": "invalid webhook url"}))
    result = await send(receiver("wecom", loopback.url("/cgi-bin/webhook/send?key=bad")))
    assert result.outcome == "permanent"


async def test_configured_headers_are_sent(loopback: Loopback) -> None:
    r = receiver("webhook", loopback.url("/hook"), headers={"Authorization": "Bearer abc123456", "X-Team": "llm"})
    assert (await send(r)).ok
    (item,) = loopback.received
    assert item.headers["authorization"] == "Bearer abc123456" and item.headers["x-team"] == "llm"
    assert item.headers["user-agent"].startswith("ttft-monitor/")


async def test_the_log_receiver_writes_one_structured_line() -> None:
    with capture_logs() as logs:
        result = await send(receiver("log"), name="console")
    assert result.ok
    (line,) = logs
    assert line["event"] == "alert_notification" and line["receiver"] == "console"
    assert line["log_level"] == "warning"
    assert line["baseline_ms"] == 410.0 and line["observed_ms"] == 1234.0 and line["ratio"] == 3.01
    assert line["cause"] is None and line["attribution"] is None


async def test_the_log_receivers_line_says_where_the_time_went() -> None:
    where = "client TTFT 1,234 ms (baseline 410); server TTFT 1,200 ms (baseline 380): queueing on the server"
    with capture_logs() as logs:
        assert (await send(receiver("log"), name="console", cause="server_queue", attribution=where)).ok
    (line,) = logs
    assert line["cause"] == "server_queue" and line["attribution"] == where


async def test_a_receiver_with_a_broken_config_fails_permanently_without_sending(loopback: Loopback) -> None:
    result = await send(receiver("pagerduty", loopback.url("/v2/enqueue")), name="pd")
    assert result.outcome == "permanent"
    assert result.detail.startswith("alerts.receivers.pd: a pagerduty receiver needs the integration's routing key")
    assert loopback.received == []
