"""The commands of `ttft-monitor`, one module each: parse its arguments, call the stage, print, pick the exit code.

Every module has `NAME`, `register(parser)` adding its options (argparse only at import, so building the whole
parser stays fast: `once` in a CronJob builds it too) and `main(args) -> int`; the stages below keep the logic.
`monitor.cli` is the registry that lists them, with the help line and description of each.
What they share: argument types (`args.py`), loading the config and one line for a database error (`common.py`).
"""
