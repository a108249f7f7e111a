"""``waltz bench --scale MODE``: how the cost grows (issue 43), one mode a run.

* ``partitions``: writes/s, latency and the cluster's CPU a write for more and more
  partitions on one server (a preset of the ``--compare`` sweep: ``scale_partitions.py``);
* ``idle-clients``: the server's memory and CPU for many mounted clients that do nothing
  (``idle_clients.py``);
* ``failover``: how long each partition goes without commits when its owner is killed,
  and through a rolling restart (``failover_time.py``);
* ``tls``: mutual TLS against plain text, cell by cell (``tls_cost.py``).

Every cell runs on a fresh local cluster (3 storage nodes, 3 replicas, fsync on). This
module runs the mode and writes the JSON file; ``scale_settings.py`` holds the options,
their defaults by mode and their checks.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .scale_settings import ScaleArgumentError, ScaleSettings, settings_of, settings_record

if TYPE_CHECKING:
    import argparse


def cmd_scale(args: argparse.Namespace) -> int:
    try:
        settings = settings_of(args)
    except ScaleArgumentError as e:
        print(f"waltz bench: error: {e}")
        return 2
    from waltz_client.runtime import event_loop
    from waltz_client.wire.native import describe as describe_loops

    print(
        f"waltz bench --scale {settings.mode}: a fresh local cluster a cell (3 storage "
        f"nodes, 3 replicas); {os.cpu_count()} CPUs ({platform.machine()}), fsync on, "
        f"per-record loops {describe_loops()}, the load on {event_loop.describe()}",
        flush=True,
    )

    def say(line: str) -> None:
        print(line, flush=True)

    run: Callable[[ScaleSettings, Callable[[str], None]], list[dict[str, Any]]]
    if settings.mode == "partitions":
        from .scale_partitions import run
    elif settings.mode == "idle-clients":
        from .idle_clients import run
    elif settings.mode == "failover":
        from .failover_time import run
    else:
        from .tls_cost import run
    try:
        cells = run(settings, say)
    except ScaleArgumentError as e:  # found out once the mode looked: a limit of this machine
        print(f"waltz bench: error: {e}")
        return 2
    if args.json:
        doc = {"mode": settings.mode, "settings": settings_record(settings), "cells": cells}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0
