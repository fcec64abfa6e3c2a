"""``wattpipe top``: a live terminal view of what a wattpipe attributes (skeleton, work in progress)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``wattpipe top``."""
    parser.add_argument(
        "--url",
        default=None,
        help="a running wattpipe's /metrics (e.g. http://node:28282/metrics); default: run the demo and read it",
    )
    parser.add_argument("--every", type=float, default=2.0, help="seconds between refreshes (default 2)")


def main(args: argparse.Namespace) -> int:
    """Run the live view until q or Ctrl-C; the exit code."""
    print("wattpipe top: not implemented yet", file=sys.stderr)
    return 1


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="wattpipe top")
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
