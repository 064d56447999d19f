"""`ttft-monitor serve`: the status pages and JSON API alone, read-only (monitor.web.serve).

Exit codes: 0 stopped (or the hash printed), 2 usage or config error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from monitor.commands.args import config_arg
from monitor.commands.common import load_config_or_explain
from monitor.exitcodes import EXIT_OK, EXIT_USAGE

NAME = "serve"


def register(parser: argparse.ArgumentParser) -> None:
    config_arg(parser)
    parser.add_argument("--listen", default="127.0.0.1:9464", help="HOST:PORT to serve on (127.0.0.1:9464)")
    parser.add_argument(
        "--hash-password",
        action="store_true",
        help="read a password on stdin and print its hash for web.basic_password_hash, then exit",
    )


def main(args: argparse.Namespace) -> int:
    if args.hash_password:
        import getpass

        from monitor.web.auth import hash_password

        password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
        if not password:
            print("ttft-monitor serve: an empty password cannot be hashed; type one", file=sys.stderr)
            return EXIT_USAGE
        print(hash_password(password))
        return EXIT_OK
    from monitor.config.urls import check_listen_address
    from monitor.web.serve import serve

    try:
        check_listen_address(args.listen)
    except ValueError as exc:
        print(f"ttft-monitor serve: --listen: {exc}", file=sys.stderr)
        return EXIT_USAGE
    config = load_config_or_explain(args.config, sys.stderr)
    if config is None:
        return EXIT_USAGE
    return asyncio.run(serve(config, args.listen, out=sys.stderr))  # the stream of this call, not of import time
