"""Cutting TCP links on this machine with nftables, for the fault tests.

A ``LinkCut`` owns one nftables table, ``inet waltz_fault_<pid>_<n>``, with an input and
an output chain; each ``cut`` adds drop rules to them and ``heal`` flushes them. Leaving
the ``with`` block deletes the table (and the cgroups below), however the block ends.
``remove_leftovers`` deletes what a killed test run left behind: tables and cgroups
whose name carries the pid of a process that no longer exists.

Two kinds of source:

- ``None``: every process. ``cut(None, port)`` drops every packet to or from that TCP
  port. Enough where the port belongs to one listener (a storage node) and only the
  process under test talks to it.
- a ``Group``: the processes started in one cgroup v2 (``Group.wrap`` prefixes a
  command so that it moves itself into the cgroup before ``exec``, so every socket it
  ever opens belongs to the cgroup: the kernel stamps a socket with its creator's
  cgroup when it is created and never changes it, so moving a running daemon would
  leave its open connections uncut). ``cut(group, port)`` drops what the group's
  sockets send to the port (output chain, ``socket cgroupv2``) and what the port sends
  to the group's sockets (input chain: the rule looks up the receiving socket). This
  cuts one process off a port that others share, such as ZooKeeper's.

nft names a cgroup by its path under /sys/fs/cgroup and by its depth (``level``) in the
hierarchy, so a group is a directory made directly in the cgroup2 mount. A dropped
packet is silent, like a pulled cable: connects and requests time out, nothing is reset.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence

PREFIX = "waltz_fault_"
NFT_CGROUP_BASE = "/sys/fs/cgroup"  # nft resolves cgroupv2 paths below this directory
_counter = itertools.count(1)


class NetCutError(RuntimeError):
    """nft (or the cgroup file system) refused; the message is its first line."""


def nft_binary() -> str | None:
    """The nft command (root's PATH has /usr/sbin; another's may not)."""
    found = shutil.which("nft")
    if found is None:
        found = next((p for p in ("/usr/sbin/nft", "/sbin/nft") if os.access(p, os.X_OK)), None)
    return found


def _run_nft(args: list[str], script: str | None = None) -> str:
    binary = nft_binary()
    if binary is None:
        raise NetCutError("nft is not installed")
    try:
        done = subprocess.run(
            [binary, *args], input=script, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetCutError(f"nft: {e}") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise NetCutError(lines[0] if lines else f"nft exited with status {done.returncode}")
    return done.stdout


def nft(script: str) -> str:
    """Run an nft script (``nft -f -``); its output, or NetCutError with nft's complaint."""
    return _run_nft(["-f", "-"], script)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_pid(name: str) -> int | None:
    """The pid in ``waltz_fault_<pid>_...``, or None for another name."""
    if not name.startswith(PREFIX):
        return None
    head = name[len(PREFIX) :].split("_", 1)[0]
    return int(head) if head.isdigit() else None


def cgroup2_mount() -> str | None:
    """Where the cgroup v2 hierarchy is mounted, if it is (``/sys/fs/cgroup`` on a pure
    v2 system, ``/sys/fs/cgroup/unified`` on a hybrid one)."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                fstype = fields[fields.index("-") + 1]
                if fstype == "cgroup2" and fields[3] == "/":
                    return fields[4]
    except (OSError, ValueError, IndexError):
        return None
    return None


class Group:
    """A cgroup v2 that the processes of one endpoint are started in."""

    def __init__(self, name: str) -> None:
        mount = cgroup2_mount()
        if mount is None:
            raise NetCutError("no cgroup v2 hierarchy is mounted")
        if os.path.commonpath([mount, NFT_CGROUP_BASE]) != NFT_CGROUP_BASE:
            raise NetCutError(f"cgroup v2 is mounted at {mount}, outside {NFT_CGROUP_BASE}")
        self.path = os.path.join(mount, name)
        try:
            os.mkdir(self.path)
        except OSError as e:
            raise NetCutError(f"cannot create the cgroup {self.path}: {e}") from None
        self.nft_path = os.path.relpath(self.path, NFT_CGROUP_BASE)
        self.level = 1  # made directly under the hierarchy's root

    def wrap(self, command: Sequence[str]) -> list[str]:
        """``command``, run so that it first moves itself into this cgroup."""
        procs = os.path.join(self.path, "cgroup.procs")
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *command]

    def remove(self) -> None:
        """Move any process still inside to the root cgroup, then remove the cgroup."""
        _remove_cgroup(self.path)


def _remove_cgroup(path: str) -> None:
    root_procs = os.path.join(os.path.dirname(path), "cgroup.procs")
    for _ in range(10):
        with contextlib.suppress(OSError):
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = f.read().split()
            for pid in pids:
                with contextlib.suppress(OSError), open(root_procs, "w") as f:
                    f.write(pid)
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            continue  # a process forked meanwhile, or is still leaving


class LinkCut:
    """One nftables table of drop rules and the cgroups they name; see the module doc."""

    def __init__(self) -> None:
        self.table = f"{PREFIX}{os.getpid()}_{next(_counter)}"
        self.groups: list[Group] = []
        self._entered = False

    def __enter__(self) -> LinkCut:
        nft(
            f"table inet {self.table} {{\n"
            f"  chain output {{ type filter hook output priority filter; policy accept; }}\n"
            f"  chain input {{ type filter hook input priority filter; policy accept; }}\n"
            f"}}\n"
        )
        self._entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            if self._entered:
                with contextlib.suppress(NetCutError):
                    nft(f"delete table inet {self.table}\n")
                self._entered = False
        finally:
            for group in self.groups:
                group.remove()
            self.groups.clear()

    def group(self, label: str) -> Group:
        """A new cgroup for one endpoint, removed with this LinkCut."""
        group = Group(f"{self.table}_{label}")
        self.groups.append(group)
        return group

    def cut(self, src: Group | None, port: int) -> None:
        """Drop TCP traffic both ways between ``src`` (``None``: anyone) and ``port``."""
        if src is None:
            rules = [("output", f"tcp dport {port}"), ("output", f"tcp sport {port}")]
        else:
            match = f'socket cgroupv2 level {src.level} "{src.nft_path}"'
            rules = [
                ("output", f"{match} tcp dport {port}"),
                ("input", f"{match} tcp sport {port}"),
            ]
        nft("".join(f"add rule inet {self.table} {c} {r} counter drop\n" for c, r in rules))

    def heal(self) -> None:
        """Remove every cut; connections that were cut resume (their packets are resent)."""
        nft(f"flush chain inet {self.table} output\nflush chain inet {self.table} input\n")

    def dropped(self) -> int:
        """Packets dropped by the current cuts so far."""
        doc = json.loads(_run_nft(["-j", "list", "table", "inet", self.table]))
        total = 0
        for item in doc.get("nftables", []):
            for expr in item.get("rule", {}).get("expr", []):
                if "counter" in expr:
                    total += expr["counter"]["packets"]
        return total


def remove_leftovers(ours: bool = False) -> None:
    """Delete the tables and cgroups of earlier runs that died before cleaning up (their
    pid no longer exists), and with ``ours`` this process's too; those of other runs
    still going are left alone."""

    def stale(pid: int | None) -> bool:
        return pid is not None and ((ours and pid == os.getpid()) or not _pid_alive(pid))

    try:
        listing = _run_nft(["list", "tables", "inet"])
    except NetCutError:
        listing = ""
    for line in listing.splitlines():
        name = line.split()[-1] if line.startswith("table inet ") else ""
        if stale(_owner_pid(name)):
            with contextlib.suppress(NetCutError):
                nft(f"delete table inet {name}\n")
    mount = cgroup2_mount()
    if mount is not None:
        with contextlib.suppress(OSError):
            for name in os.listdir(mount):
                if stale(_owner_pid(name)):
                    _remove_cgroup(os.path.join(mount, name))


def nft_unavailable() -> str | None:
    """Why link cuts cannot run here (one line), or None: checks that we are root, that
    nft is installed and that the kernel takes a table with input and output chains."""
    if os.geteuid() != 0:
        return "link cuts need root (nftables rules)"
    if nft_binary() is None:
        return "nft is missing: install the nftables package (make test does, as root)"
    try:
        with LinkCut() as probe:
            probe.cut(None, 1)
    except NetCutError as e:
        return f"the kernel refused nftables rules: {e}"
    return None


def _connects(command: list[str], port: int) -> bool:
    """Whether ``command`` (a Python run, wrapped or not) connects to ``port`` within 1 s."""
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1.0).close()"
    try:
        return (
            subprocess.run([*command, "-c", code], capture_output=True, timeout=30).returncode == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def cgroup_cut_unavailable() -> str | None:
    """Why cutting by cgroup does not work here (one line), or None. Tries it: a process
    started in a group connects to a listener, then cannot once the group is cut off it,
    while this process still can."""
    try:
        with LinkCut() as links, socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(8)
            port = listener.getsockname()[1]
            group = links.group("probe")
            if not _connects(group.wrap([sys.executable]), port):
                return "a process started in a new cgroup could not connect (probe failed)"
            links.cut(group, port)
            if _connects(group.wrap([sys.executable]), port):
                return "nftables 'socket cgroupv2' rules do not match on this kernel"
            if not _connects([sys.executable], port):
                return "a cgroup cut also cut other processes (probe failed)"
    except NetCutError as e:
        return f"cannot cut links by cgroup: {e}"
    return None
