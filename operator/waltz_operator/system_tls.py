"""The operator's shell around the system PKI (system_pki.py decides): it keeps the
chart's CA and certificates in their Secrets, at start-up and then every hour, and serves
its own /metrics and /healthz with its certificate, reloaded when renewed.

Every replica runs it (a standby serves HTTPS too). Two replicas writing at once are
harmless: the CA is only ever created with a create call (the second replica's fails
with 409 and it takes the first one's), and leaves renewed by both are both the CA's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import logging
import os
import ssl
from collections.abc import Callable, Mapping
from typing import Any

from waltz_client.runtime.tls import TlsContexts, TlsFiles

from . import pki, system_pki
from .kube import ApiError, KubeApi
from .system_pki import SystemNames

log = logging.getLogger(__name__)

CHECK_EVERY = 3600.0  # seconds between looks: renewal is due 30 days before expiry
RETRY_AFTER = 30.0  # seconds, after a look that failed (the API unreachable, a conflict)


class NotOurs(Exception):
    """A Secret of a system PKI name exists but was not made by it: left alone."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


async def _read(kube: KubeApi, names: SystemNames) -> dict[str, Mapping[str, Any] | None]:
    found = {
        name: await kube.get("Secret", names.namespace, name)
        for name in system_pki.secret_names(names)
    }
    for name, secret in found.items():
        if secret is not None and not system_pki.is_ours(secret, names):
            raise NotOurs(
                f"Secret {names.namespace}/{name} exists but is not the operator's system "
                f"PKI's (its labels differ): the operator keeps the chart's CA and "
                f"certificates there. Delete or rename it"
            )
    return found


async def ensure(
    kube: KubeApi, names: SystemNames, now: datetime.datetime
) -> tuple[list[str], dict[str, Mapping[str, Any] | None]]:
    """Issue what is missing, wrong or due; what was done (no key material) and the
    Secrets as they are now."""
    for _ in range(3):  # another replica may make the CA between our read and our write
        secrets = await _read(kube, names)
        todo = system_pki.plan(names, secrets, now)
        if todo.empty:
            return [], secrets
        issued = system_pki.issue(names, todo, secrets, now)
        try:
            for secret in issued.secrets:  # the CA first: a leaf is never newer than its CA
                name = secret["metadata"]["name"]
                if name == names.ca_secret and secrets.get(name) is None:
                    await kube.create(secret)  # never two CAs: 409 if another made one
                else:
                    await kube.apply(secret)
                secrets[name] = secret
        except ApiError as e:
            if e.status != 409:
                raise
            log.info("another replica made the system CA first: using it")
            continue
        return list(issued.messages), secrets
    raise RuntimeError("the system CA kept changing under this replica; trying again later")


def _write(path: str, blob: bytes) -> None:
    """Whole files only, mode 0600: the HTTPS listener may read them at any time."""
    try:
        with open(path, "rb") as f:
            if f.read() == blob:
                return
    except OSError:
        pass
    temporary = f"{path}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(blob)
    os.replace(temporary, path)


class SystemTls:
    """Keeps the system PKI (``start`` once, then a task every ``check_every`` seconds)
    and the operator's certificate as files for its HTTPS listener."""

    def __init__(
        self,
        kube: KubeApi,
        names: SystemNames,
        directory: str,
        *,
        check_every: float = CHECK_EVERY,
        retry_after: float = RETRY_AFTER,
        reload_every: float = 5.0,
        clock: Callable[[], datetime.datetime] = _now,
    ) -> None:
        self.kube = kube
        self.names = names
        self.directory = os.path.join(directory, "system")
        self.check_every = check_every
        self.retry_after = retry_after
        self.reload_every = reload_every  # seconds between looks at the files, at most
        self.clock = clock
        self._task: asyncio.Task[None] | None = None
        self._contexts: TlsContexts | None = None
        self.checks = 0  # looks that succeeded

    @property
    def files(self) -> TlsFiles:
        """The operator's certificate and key (no client certificates are asked for)."""
        return TlsFiles(
            os.path.join(self.directory, "operator.crt"),
            os.path.join(self.directory, "operator.key"),
            None,
            verify_peer=False,
        )

    async def check(self) -> None:
        """One look: issue what is due, refresh the operator's certificate files."""
        messages, secrets = await ensure(self.kube, self.names, self.clock())
        for message in messages:
            log.info("%s", message)
        if self.names.operator_service:
            found = secrets.get(self.names.operator_secret) or {}
            data = found.get("data") or {}
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            # The key first: a certificate newer than its key would not load; the
            # listener keeps its previous context until both load (TlsContexts).
            _write(self.files.key or "", base64.b64decode(data["tls.key"]))
            _write(self.files.cert or "", base64.b64decode(data["tls.crt"]))
        self.checks += 1

    async def start(self) -> None:
        """The first look, tried until it succeeds (nothing can be served before), then
        the periodic ones in the background."""
        while True:
            try:
                await self.check()
                break
            except (ApiError, NotOurs, RuntimeError, OSError, pki.Unreadable) as e:
                log.error("system PKI: %s; trying again in %g s", e, self.retry_after)
                await asyncio.sleep(self.retry_after)
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        delay = self.check_every
        while True:
            await asyncio.sleep(delay)
            try:
                await self.check()
                delay = self.check_every
            except Exception as e:  # keep the loop: the next look may succeed
                log.error("system PKI: %s; trying again in %g s", e, self.retry_after)
                delay = self.retry_after

    def listening_context(self) -> ssl.SSLContext:
        """For the HTTPS listener: each handshake takes the newest certificate files."""
        if self._contexts is None:
            self._contexts = TlsContexts(self.files, listening=True, check_every=self.reload_every)
        return self._contexts.listening_context()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
