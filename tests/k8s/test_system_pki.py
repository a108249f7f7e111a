"""The chart's own CA (operator/waltz_operator/system_pki.py), pure: what the operator
plans to write for a set of Secrets at a given time, what it issues, and that the names
it issues for are the ones the chart mounts, dials and checks (the operator's arguments
as the chart renders them, parsed by the operator's own parser). The real ZooKeeper
serving these certificates is tests/k8s/test_zookeeper_tls.py."""

from __future__ import annotations

import base64
import datetime
import subprocess
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from helm_binary import helm_path
from test_helm import CHART, by_kind, named, render
from test_pki import cert, data, dns_names

from waltz_operator import pki, system_pki
from waltz_operator.main import parser, system_names
from waltz_operator.system_pki import KEYSTORE, SystemNames

NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)
NAMES = SystemNames("rel-waltz-system", "waltz", "rel-waltz-operator", "rel-zookeeper")


def issue_all(
    now: datetime.datetime = NOW, secrets: dict | None = None, names: SystemNames = NAMES
) -> dict[str, Any]:
    """Every Secret of a new system PKI (or what the plan for ``secrets`` writes, over
    them), by name."""
    secrets = dict(secrets or {})
    issued = system_pki.issue(names, system_pki.plan(names, secrets, now), secrets, now)
    return {**secrets, **{s["metadata"]["name"]: s for s in issued.secrets}}


def with_data(secret: dict, **changes: bytes) -> dict:
    encoded = {k.replace("_", "."): base64.b64encode(v).decode() for k, v in changes.items()}
    return {**secret, "data": {**secret["data"], **encoded}}


def test_a_new_install_gets_a_ca_and_the_zookeeper_and_operator_certificates():
    secrets = issue_all()
    assert sorted(secrets) == [
        "rel-waltz-system-ca",
        "rel-waltz-system-ca-cert",
        "rel-waltz-system-operator-tls",
        "rel-waltz-system-zookeeper-tls",
    ]
    ca = cert(secrets["rel-waltz-system-ca"], "ca.crt")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # Published without its key: what clients mount to verify ZooKeeper.
    assert secrets["rel-waltz-system-ca-cert"]["data"] == {
        "ca.crt": secrets["rel-waltz-system-ca"]["data"]["ca.crt"]
    }
    zookeeper = secrets["rel-waltz-system-zookeeper-tls"]
    assert zookeeper["type"] == "kubernetes.io/tls"
    leaf = cert(zookeeper)
    leaf.verify_directly_issued_by(ca)
    # Every pod under the headless Service (any ordinal) and the client Service.
    assert dns_names(leaf) == [
        "*.rel-zookeeper-headless.waltz.svc",
        "*.rel-zookeeper-headless.waltz.svc.cluster.local",
        "rel-zookeeper.waltz.svc",
        "rel-zookeeper.waltz.svc.cluster.local",
    ]
    # A server certificate only: clients authenticate with their digest credential.
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    # ZooKeeper's PEM key store: the PKCS#8 key, then the certificate, in one file.
    key = data(zookeeper, "tls.key")
    assert key.startswith(b"-----BEGIN PRIVATE KEY-----\n")
    assert data(zookeeper, KEYSTORE) == key + data(zookeeper, "tls.crt")
    loaded = serialization.load_pem_private_key(key, password=None)
    assert isinstance(loaded, ec.EllipticCurvePrivateKey)
    operator = cert(secrets["rel-waltz-system-operator-tls"])
    operator.verify_directly_issued_by(ca)
    assert dns_names(operator) == [
        "rel-waltz-operator",
        "rel-waltz-operator.waltz",
        "rel-waltz-operator.waltz.svc",
        "rel-waltz-operator.waltz.svc.cluster.local",
    ]
    assert KEYSTORE not in secrets["rel-waltz-system-operator-tls"]["data"]
    for secret in secrets.values():
        assert secret["metadata"]["namespace"] == "waltz"
        assert system_pki.is_ours(secret, NAMES)
        assert "ownerReferences" not in secret["metadata"]  # they outlive a release
    # Nothing more to do, until the leaves are two thirds into their 90 days.
    assert system_pki.plan(NAMES, secrets, NOW + 59 * DAY).empty


def test_only_the_certificates_asked_for_are_issued():
    only_operator = SystemNames("rel-waltz-system", "waltz", operator_service="rel-waltz-operator")
    assert sorted(issue_all(names=only_operator)) == [
        "rel-waltz-system-ca",
        "rel-waltz-system-ca-cert",
        "rel-waltz-system-operator-tls",
    ]
    only_zookeeper = SystemNames("rel-waltz-system", "waltz", zookeeper="rel-zookeeper")
    assert "rel-waltz-system-operator-tls" not in issue_all(names=only_zookeeper)


def test_leaves_are_renewed_two_thirds_into_their_life_the_ca_keeping_its_key():
    first = issue_all()
    todo = system_pki.plan(NAMES, first, NOW + 61 * DAY)
    assert todo.authority is None and not todo.publish
    assert {p.secret for p, _ in todo.leaves} == {
        "rel-waltz-system-zookeeper-tls",
        "rel-waltz-system-operator-tls",
    }
    assert all("renewed two thirds into its life" in why for _, why in todo.leaves)
    renewed = issue_all(NOW + 61 * DAY, first)
    old, new = first["rel-waltz-system-zookeeper-tls"], renewed["rel-waltz-system-zookeeper-tls"]
    assert data(new, "tls.key") != data(old, "tls.key")  # a new key too
    assert data(new, KEYSTORE) == data(new, "tls.key") + data(new, "tls.crt")
    assert renewed["rel-waltz-system-ca"] == first["rel-waltz-system-ca"]
    # The CA, two thirds into its ten years: the same key, and every leaf again.
    later = NOW + 2500 * DAY
    todo = system_pki.plan(NAMES, renewed, later)
    assert todo.authority == pki.RENEW and todo.publish and len(todo.leaves) == 2
    again = issue_all(later, renewed)
    assert data(again["rel-waltz-system-ca"], "ca.key") == data(
        renewed["rel-waltz-system-ca"], "ca.key"
    )
    # Old leaves verify under the renewed CA certificate: nothing breaks mid-rollout.
    cert(new).verify_directly_issued_by(cert(again["rel-waltz-system-ca"], "ca.crt"))


def _pkcs1(secret: dict) -> dict:
    key = serialization.load_pem_private_key(data(secret, "tls.key"), password=None)
    sec1 = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    return with_data(secret, tls_key=sec1, keystore_pem=sec1 + data(secret, "tls.crt"))


@pytest.mark.parametrize(
    ("spoil", "why"),
    [
        (lambda s: with_data(s, keystore_pem=b"x"), "its 'keystore.pem' is not its tls.key"),
        (
            lambda s: {**s, "data": {k: v for k, v in s["data"].items() if k != KEYSTORE}},
            "its 'keystore.pem' is not its tls.key",
        ),
        (_pkcs1, "its tls.key is not PKCS#8"),
        (lambda s: with_data(s, tls_crt=b"junk"), "its 'tls.crt' is not a PEM certificate"),
        (lambda s: None, "missing"),
    ],
    ids=["keystore-other", "keystore-missing", "key-not-pkcs8", "cert-junk", "missing"],
)
def test_a_spoiled_zookeeper_secret_is_issued_again_saying_why(spoil, why):
    secrets = issue_all()
    name = "rel-waltz-system-zookeeper-tls"
    secrets[name] = spoil(secrets[name])
    todo = system_pki.plan(NAMES, secrets, NOW)
    ((profile, reason),) = todo.leaves
    assert profile.secret == name and reason.startswith(why)


def test_a_lost_ca_is_replaced_and_every_leaf_issued_again_under_it():
    secrets = issue_all()
    del secrets["rel-waltz-system-ca"]
    todo = system_pki.plan(NAMES, secrets, NOW)
    assert todo.authority == pki.CREATE and todo.publish and len(todo.leaves) == 2
    again = issue_all(NOW, secrets)
    ca = cert(again["rel-waltz-system-ca"], "ca.crt")
    for name in ("rel-waltz-system-zookeeper-tls", "rel-waltz-system-operator-tls"):
        cert(again[name]).verify_directly_issued_by(ca)


def test_a_secret_of_our_name_made_by_someone_else_is_not_ours():
    secrets = issue_all()
    theirs = {**secrets["rel-waltz-system-ca"], "metadata": {"name": "rel-waltz-system-ca"}}
    assert not system_pki.is_ours(theirs, NAMES)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prefix": "Rel"}, "the system PKI prefix (--system-pki) must be a DNS label"),
        ({"prefix": ""}, "the system PKI prefix (--system-pki) must be a DNS label"),
        ({"namespace": "a.b"}, "the namespace must be a DNS label"),
        ({"zookeeper": "zk_1"}, "the bundled ZooKeeper's name (--zookeeper-tls) must be"),
        ({"operator_service": "-op"}, "the operator's Service (--operator-service) must be"),
    ],
)
def test_bad_names_are_refused_naming_the_argument(kwargs, message):
    fields = {"prefix": "p", "namespace": "ns", **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SystemNames(**fields)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--zookeeper-tls=zk"], "need --system-pki PREFIX"),
        (["--metrics-tls"], "need --system-pki PREFIX"),
        (["--system-pki=p", "--metrics-tls"], "--metrics-tls needs --operator-service"),
        (["--system-pki=P_Q"], "must be a DNS label"),
    ],
)
def test_the_operators_system_pki_arguments_are_checked(argv, message):
    args = parser().parse_args(["--leader-namespace=waltz", *argv])
    with pytest.raises(SystemExit, match=message):
        system_names(args, ["waltz"])


# --- the chart and the operator agree on every name ---------------------------------------


def _matches(name: str, host: str) -> bool:
    """A certificate name against a host as TLS clients match them: a leading ``*``
    stands for exactly one label."""
    if name.startswith("*."):
        label, _, rest = host.partition(".")
        return bool(label) and rest == name[2:]
    return name == host


def _names_from_the_chart(objects: list[dict]) -> tuple[SystemNames, Any]:
    (operator,) = [o for o in by_kind(objects)["Deployment"] if "operator" in o["metadata"]["name"]]
    container = operator["spec"]["template"]["spec"]["containers"][0]
    args = parser().parse_args([*container["args"], "--leader-namespace=waltz"])
    names = system_names(args, ["waltz"])
    assert names is not None
    return names, args


def test_the_chart_starts_the_operator_with_the_names_it_mounts_and_dials():
    objects = render("--set", "cluster.enabled=true,monitoring.podMonitor.enabled=true")
    names, args = _names_from_the_chart(objects)
    assert args.metrics_tls
    secrets = issue_all(names=names)
    kinds = by_kind(objects)
    # ZooKeeper mounts the certificate the operator issues for it, key store included.
    (ensemble,) = kinds["StatefulSet"]
    volumes = {v["name"]: v for v in ensemble["spec"]["template"]["spec"]["volumes"]}
    zk_secret = secrets[volumes["tls"]["secret"]["secretName"]]
    assert KEYSTORE in zk_secret["data"]
    # Every host a client dials (the cluster's connect string) is in its certificate.
    (cluster,) = kinds["WaltzCluster"]
    leaf = cert(zk_secret)
    hosts = [h.rsplit(":", 1)[0] for h in cluster["spec"]["zookeeper"]["connect"].split(",")]
    assert len(hosts) == 3
    for host in hosts:
        assert any(_matches(n, host) for n in dns_names(leaf)), host
    # ... and the client Service, for applications that dial it.
    assert "rel-zookeeper.waltz.svc" in dns_names(leaf)
    # The cluster verifies ZooKeeper with the CA alone (no client certificate in it).
    assert secrets[cluster["spec"]["zookeeper"]["tlsSecret"]]["data"].keys() == {"ca.crt"}
    # Prometheus checks the operator's HTTPS against the CA for a name its certificate has.
    monitor = named(kinds["PodMonitor"], "rel-waltz-operator")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["scheme"] == "https"
    tls = endpoint["tlsConfig"]
    assert secrets[tls["ca"]["secret"]["name"]]["data"].keys() == {tls["ca"]["secret"]["key"]}
    assert tls["serverName"] in dns_names(cert(secrets[names.operator_secret]))
    # The operator's probes speak HTTPS.
    (operator,) = [o for o in kinds["Deployment"] if "operator" in o["metadata"]["name"]]
    container = operator["spec"]["template"]["spec"]["containers"][0]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"


def test_without_tls_the_chart_asks_for_no_system_pki():
    objects = render(
        "--set",
        "zookeeper.bundled.tls.enabled=false,operator.metricsTls=false,cluster.enabled=true",
    )
    kinds = by_kind(objects)
    (operator,) = [o for o in kinds["Deployment"] if "operator" in o["metadata"]["name"]]
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert not [a for a in container["args"] if "system" in a or "tls" in a]
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    (cluster,) = kinds["WaltzCluster"]
    assert cluster["spec"]["zookeeper"]["connect"].endswith(":2181")
    assert "tlsSecret" not in cluster["spec"]["zookeeper"]
    (ensemble,) = kinds["StatefulSet"]
    assert "annotations" not in ensemble["metadata"]
    env = {
        e["name"]: e.get("value")
        for e in ensemble["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert "ZOO_CFG_EXTRA" not in env and env["ZOO_SERVERS"].count(";2181") == 3
    # An external ZooKeeper: the operator's HTTPS only.
    external = render("--values", str(CHART / "ci" / "external-zookeeper-values.yaml"))
    names, _ = _names_from_the_chart(external)
    assert names.zookeeper == "" and names.operator_service == "rel-waltz-operator"
    assert "tlsSecret" not in by_kind(external)["WaltzCluster"][0]["spec"]["zookeeper"]


LOOKUP = '(lookup "apps/v1" "StatefulSet" .Release.Namespace (include "waltz.zookeeperName" .))'


@pytest.mark.parametrize(
    ("existing", "port"),
    [
        ('dict "metadata" (dict "name" "rel-zookeeper")', "2181"),  # made before TLS
        ('dict "metadata" (dict "annotations" (dict "waltz.io/zookeeper-tls" "true"))', "2281"),
    ],
    ids=["plain-ensemble", "tls-ensemble"],
)
def test_an_upgrade_keeps_the_ensembles_tls_as_it_was_made(existing, port, tmp_path):
    """helm template cannot look objects up: the chart's lookup of the ensemble is
    replaced by the StatefulSet an upgrade would find. Whatever tls.enabled says, the
    ensemble and its clients keep its port (switching would split them mid-roll)."""
    chart = tmp_path / "chart"
    subprocess.run(["cp", "-r", str(CHART), str(chart)], check=True)
    helpers = chart / "templates" / "_helpers.tpl"
    assert LOOKUP in helpers.read_text()
    helpers.write_text(helpers.read_text().replace(LOOKUP, f"({existing})"))
    for enabled in ("true", "false"):
        values = f"cluster.enabled=true,zookeeper.bundled.tls.enabled={enabled}"
        out = subprocess.run(
            [helm_path(), "template", "rel", str(chart), "-n", "waltz", "--set", values],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        kinds = by_kind([d for d in yaml.safe_load_all(out) if d])
        connect_to = kinds["WaltzCluster"][0]["spec"]["zookeeper"]["connect"]
        assert {h.rsplit(":", 1)[1] for h in connect_to.split(",")} == {port}, enabled
        (ensemble,) = kinds["StatefulSet"]
        container = ensemble["spec"]["template"]["spec"]["containers"][0]
        assert container["ports"][0]["containerPort"] == int(port)
