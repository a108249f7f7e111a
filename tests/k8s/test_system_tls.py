"""The operator keeps the chart's own CA (operator/waltz_operator/system_tls.py) on the
strict API server (strict_api/): two replicas starting at once make one CA and
certificates under it, the operator's /healthz and /metrics are served over HTTPS with
its certificate (checked for its Service name against the published CA), a renewed
certificate is served to the next connection without a restart, and a Secret of the
same name made by someone else is left alone."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ssl

import aiohttp
import pytest
from cryptography import x509
from operator_harness import NS, OPERATOR_TOKEN, kubernetes_api

from waltz_operator.handlers import OperatorConfig, serve_http
from waltz_operator.kube import Connection, KubeApi
from waltz_operator.system_pki import SystemNames
from waltz_operator.system_tls import NotOurs, SystemTls, ensure

SECRETS = "v1/secrets"
NAMES = SystemNames("rel-waltz-system", NS, "rel-waltz-operator", "rel-zookeeper")

pytestmark = pytest.mark.timeout(120)


def stored(api, name: str) -> dict:
    return api.get(SECRETS, NS, name)


def certificate(secret: dict, key: str = "tls.crt") -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(secret["data"][key]))


async def served(port: int, ca: bytes, name: str) -> tuple[int, x509.Certificate]:
    """GET /healthz over HTTPS, verifying the certificate against ``ca`` for ``name``;
    the status and the certificate served."""
    context = ssl.create_default_context(cadata=ca.decode())
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=name
    )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.write(f"GET /healthz HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
        status = int((await reader.readline()).split()[1])
    finally:
        writer.close()
    return status, x509.load_der_x509_certificate(der)


@pytest.mark.asyncio
async def test_replicas_keep_one_ca_and_serve_https_with_the_renewed_certificate(tmp_path):
    # The replicas start 61 days ago (by their clock), so that the certificates renewed
    # "today" two thirds into their life verify at the real time.
    today = datetime.datetime.now(datetime.UTC)
    now = [today - datetime.timedelta(days=61)]
    async with kubernetes_api() as api:
        kube = KubeApi(Connection(server=api.url, token=OPERATOR_TOKEN))
        replicas = [
            SystemTls(kube, NAMES, str(tmp_path / r), reload_every=0.0, clock=lambda: now[0])
            for r in ("a", "b")
        ]
        try:
            # Both replicas start at once: one CA (the other's create is refused), and
            # every certificate is that CA's.
            await asyncio.gather(*(r.start() for r in replicas))
            ca_secret = stored(api, "rel-waltz-system-ca")
            ca = certificate(ca_secret, "ca.crt")
            assert stored(api, "rel-waltz-system-ca-cert")["data"] == {
                "ca.crt": ca_secret["data"]["ca.crt"]
            }
            for name in ("rel-waltz-system-zookeeper-tls", "rel-waltz-system-operator-tls"):
                certificate(stored(api, name)).verify_directly_issued_by(ca)
            posts = [r for r in api.requests if r.method == "POST" and r.path.endswith("/secrets")]
            assert len(posts) == 2  # each replica tried to create the CA once

            # HTTPS with the operator's certificate, for its Service's name.
            config = OperatorConfig(
                connection=kube.connection,
                metrics_host="127.0.0.1",
                metrics_port=0,
                metrics_ssl=replicas[0].listening_context(),
            )
            await serve_http(config)
            try:
                assert config.metrics_url is not None
                assert config.metrics_url.startswith("https://127.0.0.1:")
                port = config.runner.addresses[0][1]
                published = base64.b64decode(
                    stored(api, "rel-waltz-system-ca-cert")["data"]["ca.crt"]
                )
                status, first = await served(port, published, "rel-waltz-operator.prod.svc")
                assert status == 200
                # Plain HTTP is not spoken there.
                async with aiohttp.ClientSession() as session:
                    with pytest.raises(aiohttp.ClientError):
                        await session.get(f"http://127.0.0.1:{port}/healthz")

                # Two thirds into its life: renewed in its Secret, served to the next
                # connection (no restart).
                now[0] = today
                await replicas[0].check()
                renewed = certificate(stored(api, "rel-waltz-system-operator-tls"))
                assert renewed.serial_number != first.serial_number
                status, second = await served(port, published, "rel-waltz-operator.prod.svc")
                assert status == 200 and second.serial_number == renewed.serial_number
                # Idle: nothing is written again.
                before = len(api.requests)
                await replicas[1].check()
                assert not [
                    r for r in api.requests[before:] if r.method in ("POST", "PATCH", "PUT")
                ]
            finally:
                await config.runner.cleanup()
        finally:
            for r in replicas:
                await r.close()
            await kube.close()


@pytest.mark.asyncio
async def test_a_secret_of_its_name_made_by_someone_else_is_left_alone():
    async with kubernetes_api() as api:
        theirs = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "rel-waltz-system-ca", "namespace": NS},
            "data": {"ca.crt": base64.b64encode(b"theirs").decode()},
        }
        api.put(theirs)
        kube = KubeApi(Connection(server=api.url, token=OPERATOR_TOKEN))
        try:
            with pytest.raises(NotOurs, match="Secret prod/rel-waltz-system-ca exists but"):
                await ensure(kube, NAMES, datetime.datetime.now(datetime.UTC))
        finally:
            await kube.close()
        assert stored(api, "rel-waltz-system-ca")["data"] == theirs["data"]
        assert api.get(SECRETS, NS, "rel-waltz-system-zookeeper-tls") is None
