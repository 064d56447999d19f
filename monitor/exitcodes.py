"""Every command's exit status, in one place: scripts, systemd and CronJobs branch on these numbers."""

from __future__ import annotations

EXIT_OK = 0
# The command ran, and what it checked failed: every probe failed, a delivery failed, schemas differ.
EXIT_FAILED = 1
# Bad arguments or an invalid config file: fix the input and run again.
EXIT_USAGE = 2
# The database (or other infrastructure the command needs) is unreachable or refused.
EXIT_INFRA = 3
# `once` was stopped by a signal before it finished.
EXIT_INTERRUPTED = 4
# `once` measured, but the Pushgateway refused the metrics.
EXIT_PUSH = 5
