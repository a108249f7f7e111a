"""TLS for every Waltz link, configured the same way everywhere: a certificate, its key,
a CA bundle to verify peers with, and whether the peer must present a certificate.

Certificates are reloaded when their files change (Kubernetes rotates a mounted Secret
in place): a listening context swaps in the newest context on each handshake (its
``sni_callback`` runs for every ClientHello, with or without SNI), and connecting code
asks for the current context on each new connection. Connections already open keep
the certificate they were made with. A rotation caught half-written (a file that does
not load) keeps the previous context and logs why, until the files load again.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from .settings import Setting

log = logging.getLogger(__name__)


class TlsError(ValueError):
    """A TLS setting that cannot work: the message names the setting."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: str | None = None  # PEM certificate (chain): ours, presented to peers
    key: str | None = None  # PEM private key of ``cert``
    ca: str | None = None  # PEM CA bundle that peers' certificates must chain to
    verify_peer: bool = True  # listening: require a client certificate; connecting: verify

    @property
    def enabled(self) -> bool:
        return any((self.cert, self.key, self.ca))

    def check(self, prefix: str = "tls", *, listening: bool) -> None:
        """Raise TlsError naming the setting (``<prefix>_cert``...) that cannot work."""
        if bool(self.cert) != bool(self.key):
            missing = "key" if self.cert else "cert"
            raise TlsError(f"setting {prefix}_{missing}: needed with {prefix}_{_other(missing)}")
        if listening and not self.cert:
            raise TlsError(f"setting {prefix}_cert: a TLS listener needs a certificate and key")
        if self.verify_peer and not self.ca:
            raise TlsError(
                f"setting {prefix}_ca: verifying peers needs a CA bundle "
                f"(or turn {prefix}_verify_peer off)"
            )
        for name in ("cert", "key", "ca"):
            path = getattr(self, name)
            if path and not os.access(path, os.R_OK):
                why = "does not exist" if not os.path.exists(path) else "is not readable"
                raise TlsError(f"setting {prefix}_{name}: {path} {why}")


def _other(name: str) -> str:
    return "cert" if name == "key" else "key"


def check_tls(files: TlsFiles, prefix: str, *, listening: bool) -> None:
    """For a daemon's config: the files are there and load, or ConfigError names them."""
    from .settings import ConfigError

    try:
        files.check(prefix, listening=listening)
        build_context(files, listening=listening)
    except TlsError as e:
        raise ConfigError(str(e)) from None
    except (ssl.SSLError, OSError) as e:
        raise ConfigError(
            f"settings {prefix}_cert, {prefix}_key, {prefix}_ca: cannot load them: {e}"
        ) from None


def build_context(files: TlsFiles, *, listening: bool) -> ssl.SSLContext:
    """A fresh context from the files (raises ssl.SSLError or OSError if one is bad)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if listening else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if files.cert and files.key:
        ctx.load_cert_chain(files.cert, files.key)
    if files.ca:
        ctx.load_verify_locations(files.ca)
    if listening:
        ctx.verify_mode = ssl.CERT_REQUIRED if files.verify_peer else ssl.CERT_NONE
    else:
        ctx.check_hostname = files.verify_peer
        ctx.verify_mode = ssl.CERT_REQUIRED if files.verify_peer else ssl.CERT_NONE
    return ctx


def _stamps(files: TlsFiles) -> tuple[tuple[int, int, int] | None, ...]:
    out = []
    for path in (files.cert, files.key, files.ca):
        try:
            st = os.stat(path) if path else None
        except OSError:
            st = None
        out.append((st.st_mtime_ns, st.st_size, st.st_ino) if st else None)
    return tuple(out)


class TlsContexts:
    """The current context for ``files``, rebuilt when a file changes (checked at most
    every ``check_every`` seconds)."""

    def __init__(
        self,
        files: TlsFiles,
        *,
        listening: bool,
        check_every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.files = files
        self.listening = listening
        self._check_every = check_every
        self._clock = clock
        self._stamps = _stamps(files)
        self._current = build_context(files, listening=listening)  # bad files: raise now
        self._checked = clock()
        self.reloads = 0
        self.failed_reloads = 0

    def current(self) -> ssl.SSLContext:
        now = self._clock()
        if now - self._checked >= self._check_every:
            self._checked = now
            stamps = _stamps(self.files)
            if stamps != self._stamps:
                self._reload(stamps)
        return self._current

    def _reload(self, stamps: tuple[Any, ...]) -> None:
        try:
            ctx = build_context(self.files, listening=self.listening)
        except (ssl.SSLError, OSError) as e:
            # Perhaps a rotation caught between two files: try again at the next check.
            self.failed_reloads += 1
            log.error("TLS files changed but do not load (%s); keeping the previous ones", e)
            return
        self._stamps = stamps
        self._current = ctx
        self.reloads += 1
        log.info("TLS certificate files changed: reloaded for new connections")

    def listening_context(self) -> ssl.SSLContext:
        """For ``create_server``: each handshake switches to the current context."""
        front = build_context(self.files, listening=True)

        def switch(ssl_object: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
            ssl_object.context = self.current()

        front.sni_callback = switch
        return front


def warn_plaintext(daemon: str, host: str, port: int, logger: logging.Logger) -> None:
    """Say once, at WARNING, that a daemon serves in plain text: nothing it says or hears
    is encrypted, and no peer proves who it is (docs/security.md)."""
    logger.warning(
        "%s listens on %s:%d in PLAIN TEXT: its traffic is unencrypted and unauthenticated; "
        "give it tls_cert, tls_key and tls_ca to turn on mutual TLS (docs/security.md)",
        daemon,
        host,
        port,
    )


def peer_identity(transport: Any) -> str | None:
    """The identity in the peer's verified certificate: its subject common name, else its
    first DNS or URI subject alternative name; None without TLS or a certificate."""
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return cast(str, value)
    for kind, value in cert.get("subjectAltName", ()):
        if kind in ("DNS", "URI"):
            return cast(str, value)
    return None


def identity_allowed(identity: str | None, patterns: tuple[str, ...]) -> bool:
    """Whether a peer's certificate identity matches one of the shell-style patterns."""
    return identity is not None and any(fnmatch.fnmatchcase(identity, p) for p in patterns)


def parse_patterns(value: str) -> tuple[str, ...]:
    """``waltz-server*,ops-*`` -> ("waltz-server*", "ops-*")."""
    patterns = tuple(p.strip() for p in value.split(",") if p.strip())
    if not patterns:
        raise ValueError("expected one or more comma-separated identity patterns")
    return patterns


def tls_open_connection(contexts: TlsContexts) -> Callable[..., Any]:
    """An ``open_connection`` that dials with the current client context, verifying the
    server's certificate for the host name or IP dialled, or for ``server_hostname`` when
    given (a server whose registration names another: ``ServerRegistration.tls_name``)."""

    async def open_connection(
        host: str, port: int, *, server_hostname: str | None = None, **kwargs: Any
    ) -> Any:
        return await asyncio.open_connection(
            host, port, ssl=contexts.current(), server_hostname=server_hostname or host, **kwargs
        )

    return open_connection


def zk_tls_settings() -> list[Setting]:
    """The daemon settings (both daemons) for reaching ZooKeeper's TLS port."""
    from .settings import Setting

    return [
        Setting("zk_tls_cert", str, "", "PEM certificate presented to ZooKeeper's TLS port"),
        Setting("zk_tls_key", str, "", "PEM private key of zk_tls_cert"),
        Setting(
            "zk_tls_ca", str, "", "PEM CA bundle of ZooKeeper's certificate: reach it over TLS"
        ),
    ]


def zk_tls_of(cert: str, key: str, ca: str) -> TlsFiles | None:
    """TlsFiles from the zk_tls_* settings, or None when they are all empty."""
    files = TlsFiles(cert or None, key or None, ca or None)
    return files if files.enabled else None


def listener_tls_settings(*, serves: str, peers: str, peer: str) -> list[Setting]:
    """The daemon settings (both daemons) for serving their protocol port, and optionally
    their HTTP port, over TLS. The help names what the daemon serves (``serves``: "clients")
    and who its peers are (``peers``: "clients", ``peer``: "client")."""
    from .settings import Setting, boolean

    return [
        Setting("tls_cert", str, "", f"PEM certificate: serve {serves} over TLS"),
        Setting("tls_key", str, "", "PEM private key of tls_cert"),
        Setting(
            "http_tls",
            boolean,
            False,
            "serve the HTTP port (metrics, probes) over HTTPS with tls_cert (no client cert asked)",
        ),
        Setting("tls_ca", str, "", f"PEM CA bundle that {peers}' certificates must chain to"),
        Setting(
            "tls_verify_peer",
            boolean,
            True,
            f"require and verify a certificate from each {peer} (mutual TLS)",
        ),
    ]


def listener_tls_of(cert: str, key: str, ca: str, verify_peer: bool) -> TlsFiles:
    """TlsFiles from the listener_tls_settings() fields (empty: not set)."""
    return TlsFiles(cert or None, key or None, ca or None, verify_peer)


def check_listener_tls(files: TlsFiles, http_tls: bool) -> None:
    """For a daemon's config: its listening TLS files load, and http_tls has them to use."""
    from .settings import ConfigError

    if files.enabled:
        check_tls(files, "tls", listening=True)
    elif http_tls:
        raise ConfigError("setting http_tls: needs tls_cert and tls_key")
