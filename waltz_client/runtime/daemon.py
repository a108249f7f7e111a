"""What every Waltz daemon does the same way: run on uvloop, log, serve HTTP, write the
ready file. Shared by the storage and server daemons."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from . import event_loop, file_limit
from .http_guard import GuardedSite, start_guarded_http
from .json_logs import TEXT, configure_logging
from .tls import TlsContexts, TlsFiles

# A probe: whether it passes, and the JSON body that says why.
Probe = Callable[[], tuple[bool, dict[str, Any]]]


def probe_app(healthz: Probe, readyz: Probe, registry: CollectorRegistry) -> web.Application:
    """A daemon's HTTP endpoints: ``/healthz`` and ``/readyz`` answer 200 when their probe
    passes and 503 when not, with its body; ``/metrics`` is the registry's text format."""

    def answer(probe: Probe) -> Callable[[web.Request], Coroutine[Any, Any, web.Response]]:
        async def handle(_: web.Request) -> web.Response:
            ok, body = probe()
            return web.json_response(body, status=200 if ok else 503)

        return handle

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", answer(healthz))
    app.router.add_get("/readyz", answer(readyz))
    app.router.add_get("/metrics", metrics)
    return app


def settle_heap() -> None:
    """Once started: the objects made so far (modules, config, partitions) last the
    process's life, so the cyclic collector stops walking them (``gc.freeze``). A busy
    daemon keeps thousands of objects alive between collections (a batch's records), and
    each full collection walked the whole heap again: a sixth of a storage node's CPU."""
    gc.collect()
    gc.freeze()


def write_ready_file(path: str, info: dict[str, Any]) -> None:
    """Atomically, so a watcher never reads half a file. A failure (the directory went
    away since the settings were checked) is one line and exit status 2."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(info, f)
        os.replace(tmp, path)
    except OSError as e:
        print(
            f"{os.path.basename(sys.argv[0])}: error: setting ready_file: cannot write "
            f"{path}: {e.strerror or e}",
            file=sys.stderr,
        )
        sys.exit(2)


async def start_http(
    app: web.Application, host: str, port: int, tls: TlsFiles | None = None
) -> tuple[GuardedSite, int]:
    """Serve ``app`` behind the HTTP guard (connection cap, answer and keep-alive
    deadlines); the site (``cleanup()`` it) and the bound port (``port`` 0: any).
    With ``tls``: HTTPS with its certificate, asking no client certificate (probes and
    scrapers seldom have one), reloaded when the files change."""
    context = None
    if tls is not None:
        files = TlsFiles(tls.cert, tls.key, tls.ca, verify_peer=False)
        context = TlsContexts(files, listening=True).listening_context()
    site = await start_guarded_http(app, host, port, ssl_context=context)
    return site, site.port


class HttpThread:
    """``start_http`` on a thread and event loop of its own, so that probes and scrapes
    never wait for the daemon's main loop (a storage node runs small write groups on its
    loop's thread, fsync included). The app's handlers must only read state that is safe
    to read from another thread."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="waltz-http", daemon=True
        )
        self._site: GuardedSite | None = None

    async def start(
        self, app: web.Application, host: str, port: int, tls: TlsFiles | None = None
    ) -> int:
        """Serve ``app``; the bound port. Raises what ``start_http`` raises (OSError)."""
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(start_http(app, host, port, tls), self._loop)
        site, bound = await asyncio.wrap_future(started)
        self._site = site
        return bound

    async def stop(self) -> None:
        if self._site is not None:
            cleanup = asyncio.run_coroutine_threadsafe(self._site.cleanup(), self._loop)
            await asyncio.wrap_future(cleanup)
            self._site = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join)
        self._loop.close()


def run_daemon(
    prog: str,
    load: Callable[[], Any],
    serve: Callable[[Any], Coroutine[Any, Any, int]],
    config_error: type[Exception],
) -> None:
    """Load the config (a bad one: one line, exit 2), set up logging, run ``serve`` on
    uvloop where it is installed (``event_loop``), exit with its status."""
    try:
        config = load()
    except config_error as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
    configure_logging(config.log_level, getattr(config, "log_format", TEXT))
    logging.getLogger("kazoo").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        event_loop.chosen()  # a bad WALTZ_EVENT_LOOP: one line, before serve() is called
    except event_loop.EventLoopChoiceError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
    _raise_open_files_limit(logging.getLogger(prog))
    sys.exit(event_loop.run(serve(config)))


def _raise_open_files_limit(log: logging.Logger) -> None:
    before, now, problem = file_limit.raise_open_files_limit()
    if problem is not None:
        log.warning("open files: cannot raise the limit of %d: %s", before, problem)
    elif now != before:
        log.info("open files: limit raised from %d to %d (the hard limit)", before, now)
