"""Triage: people acknowledge, resolve and label incidents and mark changes, and the labels measure
the detector's precision. `commands` registers the CLI (argparse only), `cli` runs it, `service`
holds the rules, `stats` the pure precision table; the SQL is in monitor/store/triage.py."""
