"""The layers hold beyond what `lint-imports` (run by `make test`) reads from the imports:
the contracts name every module of the client API, the lower layers load no client code,
and the client commits with the daemons' extra (aiohttp, prometheus-client, cryptography)
absent."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DAEMONS_EXTRA = ("aiohttp", "prometheus_client", "cryptography")
CLIENT_CODE = (
    "waltz_client.client",
    "waltz_client.blocking",
    "waltz_client.dbapi",
    "waltz_client.cluster_view",
)


def contracts() -> dict[str, dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def client_api_modules() -> set[str]:
    """The top level of waltz_client, where the client API lives."""
    return {
        f"waltz_client.{p.stem}"
        for p in (ROOT / "waltz_client").glob("*.py")
        if p.stem != "__init__"
    }


def test_every_client_api_module_is_bound_by_the_contracts() -> None:
    c = contracts()
    api = client_api_modules()
    assert "waltz_client.client" in api
    layer = next(line for line in c["layers"]["layers"] if "waltz_server" in line)
    in_layer = {name.strip() for name in layer.split(":")}
    assert api <= in_layer, f"add {sorted(api - in_layer)} to the layers contract"
    for contract in ("daemons-without-client", "light-client"):
        named = set(c[contract].get("forbidden_modules", [])) | set(
            c[contract].get("source_modules", [])
        )
        assert api <= named, f"add {sorted(api - named)} to the {contract} contract"
    assert set(c["client-without-daemons"]["source_modules"]) == api


def loaded_after(statement: str) -> set[str]:
    probe = f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return set(out.stdout.split())


@pytest.mark.parametrize(
    "layer", ["waltz_client.wire", "waltz_client.runtime.tls", "waltz_client.cluster.zk"]
)
def test_a_lower_layer_loads_no_client_code_and_no_daemon_extra(layer: str) -> None:
    loaded = loaded_after(f"import {layer}")
    assert layer in loaded
    assert not loaded & set(CLIENT_CODE), f"{layer} loads {sorted(loaded & set(CLIENT_CODE))}"
    assert not {m.split(".")[0] for m in loaded} & set(DAEMONS_EXTRA)


def test_the_client_commits_and_reads_with_the_daemons_extra_absent(make_cluster) -> None:
    """A client or a Spark executor installs only the core: the client must import and
    work with aiohttp, prometheus-client and cryptography impossible to import."""
    cluster = make_cluster()
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        for name in {DAEMONS_EXTRA!r}:
            sys.modules[name] = None  # importing it now raises ImportError

        from waltz_client import (
            BlockingWaltzClient, TransactionBuilder, TransactionContext, WaltzClientCallbacks,
            WaltzClientConfig,
        )

        class Put(TransactionContext):
            def partition_id(self, num_partitions):
                return 0

            def execute(self, builder: TransactionBuilder) -> bool:
                builder.set_header(7)
                builder.set_data(b"light")
                return True

        class Keep(WaltzClientCallbacks):
            def __init__(self):
                self.seen = []

            def client_high_water_mark(self, partition_id):
                return -1

            def apply_transaction(self, t):
                self.seen.append(t.header)

        keep = Keep()
        config = WaltzClientConfig({cluster.zookeeper_connect!r}, zk_root={cluster.layout.root!r})
        with BlockingWaltzClient(config, keep) as client:
            assert client.submit(Put()).committed
            client.flush()
            assert [r.data for r in client.read(0)] == [b"light"]
        assert keep.seen == [7], keep.seen
        print("committed", sorted(m for m in sys.modules if m.split(".")[0] in {DAEMONS_EXTRA!r}
              and sys.modules[m] is not None))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("committed []"), out.stdout


def test_a_waltz_group_whose_extra_is_missing_is_refused_by_name_and_the_rest_work() -> None:
    """`waltz` assembles its groups from entry points: one whose code cannot be imported
    (its extra is not installed) is listed and refused with the package's name, and the
    others still run."""
    blocked = "import sys\nsys.modules['waltz_storage'] = None\n"
    run = "from waltz_client.tools.cli import main\nmain()\n"

    def waltz(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", blocked + f"sys.argv = ['waltz', *{list(args)!r}]\n" + run],
            capture_output=True,
            text=True,
            timeout=120,
        )

    listed = waltz("--help")
    assert listed.returncode == 0, listed.stderr
    assert "storage" in listed.stdout and "unavailable: needs waltz_storage" in listed.stdout

    refused = waltz("storage", "verify", "/nowhere")
    assert refused.returncode == 2
    assert "waltz storage: error: cannot import waltz_storage" in refused.stderr
    assert "pip install 'waltz[daemons]'" in refused.stderr

    other = waltz("cluster", "--help")
    assert other.returncode == 0, other.stderr
    assert "create" in other.stdout
