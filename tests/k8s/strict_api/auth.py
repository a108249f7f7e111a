"""Authentication as kube-apiserver does it without anonymous access: a bearer token from
a table the test controls (add, rotate, expire: it is a plain dict), or a client
certificate signed by the configured CA (the user is its CN, its groups its O).
Anything else is a 401."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from aiohttp import web

ANONYMOUS = "system:anonymous"
# Paths kube-apiserver serves to anyone (health checks).
PUBLIC_PATHS = ("/healthz", "/livez", "/readyz")


def _subject_field(cert: Mapping[str, Any], name: str) -> list[str]:
    found = []
    for rdn in cert.get("subject") or ():
        for key, value in rdn:
            if key == name:
                found.append(value)
    return found


def user_of(request: web.Request, tokens: Mapping[str, str], anonymous: bool) -> str | None:
    """Who makes the request; None: nobody we know (a 401)."""
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token.strip() in tokens:
            return tokens[token.strip()]
        return None  # a credential that does not authenticate is never anonymous
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport else None
    if isinstance(ssl_object, ssl.SSLObject):
        cert = ssl_object.getpeercert()
        if cert:  # verified against the client CA by the TLS handshake
            names = _subject_field(cert, "commonName")
            if names:
                return names[0]
    return ANONYMOUS if anonymous else None
