"""The operator reaches ZooKeeper with the credential and certificate a WaltzCluster's
spec names: it creates the metadata under ACLs with the credential from
``spec.zookeeper.authSecret`` (read through the API), waits, saying why, while that
Secret is missing, and turns a TLS Secret into private files for kazoo."""

from __future__ import annotations

import base64
import os
import stat

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import Permissions
from operator_harness import (
    NS,
    WZ,
    cluster_doc,
    condition,
    create_cluster_object,
    eventually,
    kubernetes_api,
    obj,
    running_operator,
)

from waltz_client.cluster import admin
from waltz_client.cluster.paths import ClusterPaths
from waltz_operator.zk_secrets import SecretProblem, credential_of, write_tls_files


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def secret(name: str, data: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "data": {k: b64(v) for k, v in data.items()},
    }


@pytest.mark.asyncio
async def test_the_cluster_is_created_under_acls_with_the_specs_credential(zookeeper, zk, zk_root):
    doc = cluster_doc(zookeeper, zk_root)
    doc["spec"]["zookeeper"]["authSecret"] = "demo-zk-auth"
    async with kubernetes_api() as api:
        create_cluster_object(api, doc)
        async with running_operator(api, NS, interval=0.2):
            # No Secret yet: nothing is created, and the status says which is missing.
            body = await eventually(
                lambda: (
                    (b := obj(api, WZ, NS, "demo"))
                    and condition(b, "Degraded").get("reason") == "SecretUnusable"
                    and b
                ),
                what="Degraded SecretUnusable",
            )
            assert (
                "Secret prod/demo-zk-auth (spec.zookeeper.authSecret) does not exist"
                in (condition(body, "Degraded")["message"])
            )
            assert not zk.exists(ClusterPaths.of(zk_root).cluster)
            api.put(secret("demo-zk-auth", {"credential": "waltz:s3cret"}))
            await eventually(
                lambda: (
                    condition(obj(api, WZ, NS, "demo"), "ClusterCreated").get("status") == "True"
                ),
                what="ClusterCreated",
            )
            server = await eventually(
                lambda: obj(api, "apps/v1/deployments", NS, "demo-server"), what="Deployment"
            )
        assert condition(obj(api, WZ, NS, "demo"), "Degraded").get("status") != "True"
    paths = ClusterPaths.of(zk_root)
    acls, _ = zk.get_acls(paths.ownership)
    assert {(a.id.scheme, a.perms) for a in acls} == {
        ("digest", Permissions.ALL),
        ("world", Permissions.READ),
    }
    assert acls[0].id.id.startswith("waltz:")
    with pytest.raises(NoAuthError):  # a stranger reads, but cannot write
        zk.set(paths.ownership, b"{}")
    assert admin.read_params(zk, zk_root).name == f"{NS}/demo"
    # The servers get the same Secret, mounted.
    volumes = server["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "zk-auth",
        "secret": {
            "secretName": "demo-zk-auth",
            "defaultMode": 0o440,
            "items": [{"key": "credential", "path": "credential"}],
        },
    } in volumes


def test_a_credential_secret_must_hold_user_and_password():
    good = {"data": {"credential": b64("waltz:pw\n")}}
    assert credential_of(good, "s").user == "waltz"
    assert "pw" not in repr(credential_of(good, "s"))  # never in a log line
    for data, problem in (
        ({}, "has no key 'credential'"),
        ({"credential": b64("no-colon")}, "must hold user:password"),
        ({"credential": "***"}, "is not base64"),
    ):
        with pytest.raises(SecretProblem, match=problem):
            credential_of({"data": data}, "s")


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def test_a_tls_secret_becomes_private_files_named_by_their_content(tmp_path):
    data = {"tls.crt": b64("CERT"), "tls.key": b64("KEY"), "ca.crt": b64("CA")}
    files, digest = write_tls_files({"data": data}, "s", str(tmp_path / "zk-tls"))
    assert read(files.cert) == "CERT" and read(files.ca) == "CA"
    assert stat.S_IMODE(os.stat(files.key).st_mode) == 0o600
    again, same = write_tls_files({"data": data}, "s", str(tmp_path / "zk-tls"))
    assert (again, same) == (files, digest)
    rotated, other = write_tls_files(
        {"data": {**data, "tls.crt": b64("CERT2")}}, "s", str(tmp_path / "zk-tls")
    )
    assert other != digest and read(rotated.cert) == "CERT2"
    with pytest.raises(SecretProblem, match=r"has no key 'ca\.crt'"):
        write_tls_files({"data": {"tls.crt": b64("C"), "tls.key": b64("K")}}, "s", str(tmp_path))
