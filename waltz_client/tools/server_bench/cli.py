"""``waltz server ...``: server tools (the benchmark)."""

from __future__ import annotations

import argparse

from . import catch_up, commit_rate


def register(groups: argparse._SubParsersAction) -> None:
    server = groups.add_parser("server", help="server tools (benchmarks)")
    cmds = server.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commit_rate.register(cmds)
    catch_up.register(cmds)
