"""`ttft-monitor sim`: serve the built-in LLM API simulator (monitor.sim). Exit codes: 0 stopped, 2 usage."""

from __future__ import annotations

import argparse
import os
import sys

from monitor.commands.args import port_number
from monitor.exitcodes import EXIT_OK, EXIT_USAGE

NAME = "sim"
# Here rather than in monitor.sim: `probe --with-sim` names it in its help, and monitor.sim loads aiohttp.
SIM_DEFAULT_PORT = 8400


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_number, default=SIM_DEFAULT_PORT, help="0 picks a free port")
    parser.add_argument("--no-noise", action="store_true", help="exact latencies (noise sigma 0)")
    parser.add_argument("--seed", type=int, help="seed the noise for repeatable runs")
    parser.add_argument("--api-key-env", help="require the key in this environment variable")


def main(args: argparse.Namespace) -> int:
    from monitor.sim.server import run

    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            print(f"ttft-monitor sim: environment variable {args.api_key_env} is not set", file=sys.stderr)
            return EXIT_USAGE
    try:
        run(args.host, args.port, noise=not args.no_noise, seed=args.seed, api_key=api_key)
    except OSError as exc:
        print(
            f"ttft-monitor sim: cannot listen on {args.host}:{args.port}: {exc.strerror}; "
            "choose another --port or stop what uses it",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return EXIT_OK
