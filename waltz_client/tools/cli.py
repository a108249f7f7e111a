"""The ``waltz`` admin command.

Subcommand groups are contributed through the ``waltz.commands`` entry-point
group (see pyproject.toml), so this module never imports the daemons: each
entry point is a ``register(subparsers)`` function that adds its group.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib.metadata import entry_points

from waltz_client.runtime import event_loop


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="waltz", description="Waltz administration tools")
    groups = parser.add_subparsers(dest="group", required=True, metavar="GROUP")
    for ep in sorted(entry_points(group="waltz.commands"), key=lambda e: e.name):
        try:
            register = ep.load()
        except ImportError as e:  # an extra this installation lacks (the daemons', Spark)
            _unavailable(groups, ep.name, e)
        else:
            register(groups)
    return parser


def _unavailable(groups: argparse._SubParsersAction, name: str, error: ImportError) -> None:
    """A group whose code needs a package that is not installed: listed, and refused with
    the package's name when used, while every other group works."""
    missing = error.name or str(error)
    p = groups.add_parser(name, help=f"(unavailable: needs {missing}, not installed)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def refuse(args: argparse.Namespace) -> int:
        print(
            f"waltz {name}: error: cannot import {missing} ({error}): install the extra "
            f"it comes with (pip install 'waltz[daemons]' for the daemons' tools, "
            f"'waltz[spark]' for Spark)",
            file=sys.stderr,
        )
        return 2

    p.set_defaults(func=refuse)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        event_loop.chosen()  # a bad WALTZ_EVENT_LOOP: one line, before anything starts
    except event_loop.EventLoopChoiceError as e:
        print(f"waltz: error: {e}", file=sys.stderr)
        sys.exit(2)
    # Warnings and errors of our own reach the terminal; kazoo's reconnect chatter
    # (expected while the demo and smoke test stop ZooKeeper and servers) does not.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    try:
        code = args.func(args)
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:  # output piped into `head` and the like
        code = 0
    sys.exit(code or 0)


if __name__ == "__main__":
    main()
