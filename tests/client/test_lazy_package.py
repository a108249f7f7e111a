"""``waltz_client`` loads its public names on first use: a daemon that imports the shared
layers below the package (wire, cluster, settings, tls) does not load the client, the
DB-API callbacks or the cluster view, while ``from waltz_client import WaltzClient`` works
as before."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import waltz_client

CLIENT_MODULES = (
    "waltz_client.client",
    "waltz_client.blocking",
    "waltz_client.dbapi",
    "waltz_client.cluster_view",
)


@pytest.mark.parametrize("daemon", ["waltz_server.main", "waltz_storage.main"])
def test_a_daemon_does_not_load_the_client(daemon: str) -> None:
    probe = (
        f"import sys, {daemon}\n"
        f"print([m for m in {CLIENT_MODULES!r} if m in sys.modules])\n"
        "print('waltz_client.wire' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded, wire = out.stdout.split("\n")[:2]
    assert loaded == "[]", f"{daemon} loads {loaded}"
    assert wire == "True"  # it does import the shared layers


def test_every_public_name_resolves_to_its_module() -> None:
    assert waltz_client.__all__ == sorted(waltz_client._EXPORTS)
    for name, module in waltz_client._EXPORTS.items():
        value = getattr(waltz_client, name)
        assert value is getattr(importlib.import_module(module, "waltz_client"), name)
        assert name in dir(waltz_client)
    namespace: dict = {}
    exec("from waltz_client import *", namespace)
    assert set(waltz_client.__all__) <= set(namespace)
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        waltz_client.Nope  # noqa: B018
