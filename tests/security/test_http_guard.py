"""The daemons' HTTP ports against slow and hostile peers (waltz_client.runtime.http_guard), on a
real aiohttp app and real sockets: slow-loris heads and idle kept-alive connections are
closed, connections are capped, a malformed request is one WARNING line, and a
well-behaved scrape is answered meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import web

from waltz_client.runtime.http_guard import HttpLimits, start_guarded_http


def app() -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    application = web.Application()
    application.router.add_get("/healthz", healthz)
    return application


async def get(port: int, path: str = "/healthz") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    async with asyncio.timeout(10):
        body = await reader.read()
    writer.close()
    return body


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """What the peer sent before closing (a reset or broken pipe counts as closed)."""
    async with asyncio.timeout(seconds):
        try:
            return await reader.read()
        except ConnectionError:
            return b""


def test_slow_heads_and_idle_connections_are_closed_and_scrapes_served() -> None:
    async def go() -> None:
        limits = HttpLimits(answer_timeout=1.0, keepalive_timeout=1.0)
        site = await start_guarded_http(app(), "127.0.0.1", 0, limits)
        try:
            # Slow-loris: part of a head, then a byte now and then.
            r1, w1 = await asyncio.open_connection("127.0.0.1", site.port)
            w1.write(b"GET /healthz HTTP/1.1\r\nHo")
            # Kept alive after one answered request, then idle.
            r2, w2 = await asyncio.open_connection("127.0.0.1", site.port)
            w2.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"200 OK" in await r2.readuntil(b"ok")
            for _ in range(3):
                await asyncio.sleep(0.5)
                with contextlib.suppress(ConnectionError):
                    w1.write(b"s")  # fails once the guard has closed it
                assert b"200 OK" in await get(site.port)  # served meanwhile
            assert await closed_within(r1, 10) == b""
            assert await closed_within(r2, 10) == b""
            w1.close()
            w2.close()
        finally:
            await site.cleanup()

    asyncio.run(go())


def test_connections_are_capped() -> None:
    """At the cap a new connection takes the slot of the one idle the longest."""

    async def go() -> None:
        site = await start_guarded_http(app(), "127.0.0.1", 0, HttpLimits(max_connections=2))
        try:
            held = [await asyncio.open_connection("127.0.0.1", site.port) for _ in range(2)]
            await asyncio.sleep(0.1)
            assert b"200 OK" in await get(site.port)  # in the oldest one's slot
            assert await closed_within(held[0][0], 10) == b""
            assert len(site.guard.connections) <= 2
            for _, writer in held:
                writer.close()
        finally:
            await site.cleanup()

    asyncio.run(go())


def test_a_malformed_request_is_one_warning_without_a_traceback(caplog) -> None:
    async def go() -> bytes:
        site = await start_guarded_http(app(), "127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
            writer.write(b"\x16\x03\x01 not http at all\r\n\r\n")
            answer = await closed_within(reader, 10)
            writer.close()
            assert b"200 OK" in await get(site.port)
            return answer
        finally:
            await site.cleanup()

    # aiohttp logs a bad request with its traceback (at DEBUG in 3.14, at ERROR in
    # some releases): with everything logged, it is one WARNING line instead.
    with caplog.at_level(logging.DEBUG):
        answer = asyncio.run(go())
    assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    warnings = [r for r in caplog.records if "malformed HTTP request" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is None
