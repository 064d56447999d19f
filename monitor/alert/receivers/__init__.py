"""One module per receiver type; adding one means a new module and one line here.

The config section (`alert/settings.py`) builds its receiver `type` values from `KINDS`; the receivers
read their entry through the `base.Receiver` protocol, so they never import the section back.
"""

from __future__ import annotations

from monitor.alert.receivers import alertmanager, dingtalk, feishu, log, pagerduty, slack, webhook, wecom
from monitor.alert.receivers.base import Answer, BuildError, ReceiverKind

KINDS: dict[str, ReceiverKind] = {
    "webhook": webhook.KIND,
    "slack": slack.KIND,
    "pagerduty": pagerduty.KIND,
    "alertmanager": alertmanager.KIND,
    "feishu": feishu.KIND,
    "dingtalk": dingtalk.KIND,
    "wecom": wecom.KIND,
    "log": log.KIND,
}

__all__ = ["KINDS", "Answer", "BuildError", "ReceiverKind"]
