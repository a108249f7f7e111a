"""waltz_client.runtime.tls on real sockets: mutual TLS, the peer's identity, certificates
reloaded when their files change (new connections get the new one, open connections
stay up), a half-written rotation keeps the old one, and bad settings named."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import ssl
from pathlib import Path

import pytest

from waltz_client.runtime.tls import TlsContexts, TlsError, TlsFiles, peer_identity
from waltz_client.tools.local.certs import local_pki


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, TlsFiles]:
    hosts = ["127.0.0.1", "localhost"]
    return local_pki(
        str(tmp_path / "pki"), {"waltz-storage-0": hosts, "waltz-server-0": hosts, "other": hosts}
    )


async def serve_identity(listening: TlsContexts):
    """A TLS server that answers each connection with its peer's identity."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write((peer_identity(writer.transport) or "-").encode() + b"\n")
        await writer.drain()
        await reader.read()  # stay open until the client closes
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=listening.listening_context())
    return server, server.sockets[0].getsockname()[1]


async def connect(port: int, files: TlsFiles):
    ctx = TlsContexts(files, listening=False).current()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    said = (await reader.readline()).decode().strip()
    return said, peer_identity(writer.transport), writer


async def refused(port: int, files: TlsFiles) -> bool:
    """Whether the server refuses ``files``: in TLS 1.3 the client's handshake may finish
    before the server checks its certificate, so a refusal is an error or an EOF."""
    try:
        said, _, writer = await connect(port, files)
    except (ConnectionError, OSError):
        return True
    writer.close()
    return said == ""


def test_mutual_tls_gives_each_side_the_others_identity(pki, tmp_path) -> None:
    async def go() -> None:
        storage = TlsContexts(pki["waltz-storage-0"], listening=True)
        server, port = await serve_identity(storage)
        async with server:
            seen_by_storage, seen_by_client, writer = await connect(port, pki["waltz-server-0"])
            assert (seen_by_storage, seen_by_client) == ("waltz-server-0", "waltz-storage-0")
            writer.close()
            # Without a client certificate, or with one from another CA: refused.
            other_ca = local_pki(str(tmp_path / "elsewhere"), {"waltz-server-0": ["127.0.0.1"]})
            for stranger in (TlsFiles(ca=pki["other"].ca), other_ca["waltz-server-0"]):
                assert await refused(port, stranger)

    asyncio.run(go())


def test_rotated_files_are_used_for_new_connections_while_old_ones_stay(pki, tmp_path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    src = pki["waltz-storage-0"]
    for name in ("cert", "key", "ca"):
        shutil.copy(getattr(src, name), live / name)
    files = TlsFiles(str(live / "cert"), str(live / "key"), str(live / "ca"))
    clock = [0.0]

    async def go() -> None:
        contexts = TlsContexts(files, listening=True, clock=lambda: clock[0])
        server, port = await serve_identity(contexts)
        async with server:
            _, first, old = await connect(port, pki["waltz-server-0"])
            assert first == "waltz-storage-0"
            # Rotate in place, as the kubelet does: the "other" certificate, same CA.
            shutil.copy(pki["other"].cert, live / "cert")
            shutil.copy(pki["other"].key, live / "key")
            clock[0] += 10
            _, second, new = await connect(port, pki["waltz-server-0"])
            assert second == "other" and contexts.reloads == 1
            # The connection made before the rotation is still up.
            old.write(b"x")
            await old.drain()
            assert not old.transport.is_closing()
            old.close()
            new.close()

    asyncio.run(go())


def test_a_half_written_rotation_keeps_the_previous_certificate(pki, tmp_path, caplog) -> None:
    live = tmp_path / "live"
    live.mkdir()
    src = pki["waltz-storage-0"]
    for name in ("cert", "key", "ca"):
        shutil.copy(getattr(src, name), live / name)
    files = TlsFiles(str(live / "cert"), str(live / "key"), str(live / "ca"))
    clock = [0.0]
    contexts = TlsContexts(files, listening=True, clock=lambda: clock[0])
    before = contexts.current()
    shutil.copy(pki["other"].cert, live / "cert")  # the new cert, the old key: no match
    clock[0] += 10
    with caplog.at_level(logging.ERROR):
        assert contexts.current() is before
    assert contexts.failed_reloads == 1
    assert "keeping the previous ones" in caplog.text
    shutil.copy(pki["other"].key, live / "key")  # the rotation completes
    clock[0] += 10
    assert contexts.current() is not before and contexts.reloads == 1


def test_bad_settings_name_the_setting(pki, tmp_path) -> None:
    good = pki["waltz-server-0"]
    with pytest.raises(TlsError, match="setting tls_key: needed with tls_cert"):
        TlsFiles(cert=good.cert, ca=good.ca).check(listening=False)
    with pytest.raises(TlsError, match="setting tls_cert: a TLS listener needs"):
        TlsFiles(ca=good.ca).check(listening=True)
    with pytest.raises(TlsError, match="setting tls_ca: verifying peers needs a CA"):
        TlsFiles(good.cert, good.key).check(listening=True)
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(TlsError, match=f"setting storage_tls_ca: {missing} does not exist"):
        TlsFiles(good.cert, good.key, missing).check("storage_tls", listening=True)
    TlsFiles(good.cert, good.key, good.ca).check(listening=True)
    assert not TlsFiles().enabled and good.enabled
    assert os.stat(good.key).st_mode & 0o077 == 0  # keys are private to their owner


def test_a_server_certificate_from_another_ca_is_refused(pki, tmp_path) -> None:
    elsewhere = local_pki(str(tmp_path / "elsewhere"), {"waltz-storage-0": ["127.0.0.1"]})

    async def go() -> None:
        server, port = await serve_identity(
            TlsContexts(elsewhere["waltz-storage-0"], listening=True)
        )
        async with server:
            with pytest.raises(ssl.SSLCertVerificationError):
                await connect(port, pki["waltz-server-0"])

    asyncio.run(go())


def test_daemons_refuse_tls_files_that_cannot_work(pki, tmp_path) -> None:
    from waltz_client.runtime.settings import ConfigError
    from waltz_server.config import load_config as server_config
    from waltz_storage.config import load_config as storage_config

    good, other = pki["waltz-storage-0"], pki["other"]
    base = [
        "--directory",
        str(tmp_path / "d"),
        "--cluster-key",
        "c0ffee00-1111-4222-8333-444455556666",
        "--num-partitions",
        "1",
    ]
    config = storage_config(
        [*base, "--tls-cert", str(good.cert), "--tls-key", str(good.key), "--tls-ca", str(good.ca)],
        {},
    )
    assert config.tls.enabled and config.tls_allowed_peers == ("waltz-server*",)
    with pytest.raises(ConfigError, match="setting tls_key: needed with tls_cert"):
        storage_config([*base, "--tls-cert", str(good.cert), "--tls-ca", str(good.ca)], {})
    # A certificate with another's key: the files exist but cannot load together.
    with pytest.raises(ConfigError, match="settings tls_cert, tls_key, tls_ca: cannot load"):
        storage_config(
            [
                *base,
                "--tls-cert",
                str(good.cert),
                "--tls-key",
                str(other.key),
                "--tls-ca",
                str(good.ca),
            ],
            {},
        )
    with pytest.raises(ConfigError, match=r"setting storage_tls_ca: .* does not exist"):
        server_config(
            [
                "--zookeeper",
                "127.0.0.1:2181",
                "--storage-tls-ca",
                str(tmp_path / "none.pem"),
                "--storage-tls-cert",
                str(good.cert),
                "--storage-tls-key",
                str(good.key),
            ],
            {},
        )
    with pytest.raises(ConfigError, match="tls_allowed_peers"):
        storage_config([*base, "--tls-allowed-peers", " , "], {})


def test_zookeeper_over_tls_needs_a_client_certificate(pki, tmp_path, zookeeper_available) -> None:
    """The embedded ZooKeeper's TLS port (as a `--tls` local cluster runs it): a client with
    a certificate of the CA gets in; one without, or on plain TCP, does not."""
    from waltz_client.cluster.errors import ClusterError
    from waltz_client.cluster.zk import close, connect
    from waltz_client.tools.local.zookeeper import EmbeddedZooKeeper

    server_files = local_pki(str(tmp_path / "pki"), {"waltz-zookeeper": ["127.0.0.1"]})
    zk = EmbeddedZooKeeper(str(tmp_path / "zk"), tls=server_files["waltz-zookeeper"])
    client = local_pki(str(tmp_path / "pki"), {"waltz-client": ["127.0.0.1"]})["waltz-client"]
    zk.start()
    try:
        c = connect(zk.secure_connect_string, tls=client, timeout=15)
        try:
            c.ensure_path("/over-tls")
            assert c.exists("/over-tls") is not None
        finally:
            close(c)
        for files in (None, TlsFiles(ca=client.ca)):
            with pytest.raises(ClusterError, match="did not answer"):
                close(connect(zk.secure_connect_string, tls=files, timeout=3))
    finally:
        zk.stop()
