"""The files a local ZooKeeper server reads when it starts, rewritten on each start:
``zoo.cfg``, ``myid`` for a member of an ensemble, the log4j2 configuration sending its
log to stdout, and the PEM key store of its TLS client port."""

from __future__ import annotations

import os

from waltz_client.runtime.tls import TlsFiles

_LOG4J2_PROPERTIES = """\
# Written by waltz_client.tools.local.zookeeper: the server's log goes to stdout (the log file).
status = error
rootLogger.level = {level}
rootLogger.appenderRef.stdout.ref = stdout
appender.stdout.type = Console
appender.stdout.name = stdout
appender.stdout.target = SYSTEM_OUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = %d{{ISO8601}} %-5p [%t] %c{{1}}: %m%n
"""


def log4j2_path(data_dir: str) -> str:
    return os.path.join(data_dir, "log4j2.properties")


def server_config(data_dir: str, host: str, port: int) -> dict[str, str]:
    """``zoo.cfg``'s settings of a standalone server on ``host:port``."""
    return {
        # Sessions expire on tick boundaries, up to a tick after their timeout: a dead
        # server's partitions move after its session timeout + at most 0.5 s.
        "tickTime": "500",
        "dataDir": data_dir,
        "clientPort": str(port),
        "clientPortAddress": host,
        "maxClientCnxns": "0",
        "minSessionTimeout": "2000",
        "maxSessionTimeout": "60000",
        "admin.enableServer": "false",
        "4lw.commands.whitelist": "ruok,srvr,stat,mntr",
        "autopurge.snapRetainCount": "3",
        "autopurge.purgeInterval": "1",
    }


def tls_config(data_dir: str, host: str, secure_port: int, tls: TlsFiles) -> dict[str, str]:
    """A secure client port on Netty, with PEM files: the key and certificate in one
    key store file (written now), the CA as the trust store; clients must present a
    certificate."""
    assert tls.cert and tls.key and tls.ca
    keystore = os.path.join(data_dir, "tls-keystore.pem")
    with open(tls.key, "rb") as k, open(tls.cert) as c:
        pem = _pkcs8(k.read()) + c.read()
    fd = os.open(keystore, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(pem)
    return {
        "serverCnxnFactory": "org.apache.zookeeper.server.NettyServerCnxnFactory",
        "secureClientPort": str(secure_port),
        "secureClientPortAddress": host,
        "ssl.keyStore.location": keystore,
        "ssl.keyStore.type": "PEM",
        "ssl.trustStore.location": tls.ca,
        "ssl.trustStore.type": "PEM",
        "ssl.clientAuth": "need",
        # Clients are identified by certificate, not by the address they dial from.
        "ssl.clientHostnameVerification": "false",
    }


def quorum_config(data_dir: str, server_id: int, quorum: dict[int, str]) -> dict[str, str]:
    """The settings of member ``server_id`` of an ensemble; writes its ``myid`` now."""
    # Ticks (of 0.5 s) a follower may take to connect and sync, and to stay in sync.
    config = {"initLimit": "40", "syncLimit": "20"}
    config.update({f"server.{i}": address for i, address in sorted(quorum.items())})
    _write_file(os.path.join(data_dir, "myid"), f"{server_id}\n")
    return config


def write_config_files(data_dir: str, config_path: str, config: dict[str, str], level: str) -> None:
    """``zoo.cfg`` with ``config``, and the log4j2 configuration logging at ``level``."""
    text = "# Written by waltz_client.tools.local.zookeeper on each start.\n" + "".join(
        f"{key}={value}\n" for key, value in config.items()
    )
    _write_file(config_path, text)
    _write_file(log4j2_path(data_dir), _LOG4J2_PROPERTIES.format(level=level))


def _pkcs8(key_pem: bytes) -> str:
    """ZooKeeper's PEM key store reads PKCS#8 keys only ("BEGIN PRIVATE KEY")."""
    from cryptography.hazmat.primitives import serialization  # with trustme: `local` extra

    key = serialization.load_pem_private_key(key_pem, password=None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _write_file(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
