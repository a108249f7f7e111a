"""Failure domains: storage pods spread over zones and hosts by default, and the zones
of their nodes become the replica assignment's placement groups."""

from __future__ import annotations

from waltz_operator.desired import desired_objects, selector
from waltz_operator.spec import parse
from waltz_operator.zones import group_changes, node_zone, zone_groups


def pod_templates(**spec) -> dict[str, dict]:
    doc = {
        "metadata": {"name": "demo", "namespace": "prod", "uid": "u1"},
        "spec": {"zookeeper": {"connect": "zk:2181"}, **spec},
    }
    objs = desired_objects(parse(doc))
    return {
        o["kind"]: o["spec"]["template"]["spec"]
        for o in objs
        if o["kind"] in ("StatefulSet", "Deployment")
    }


def test_pods_spread_over_zones_and_hosts_by_default():
    spec = parse(
        {"metadata": {"name": "demo", "namespace": "prod"}, "spec": {"zookeeper": {"connect": "z"}}}
    )
    for kind, component in (("StatefulSet", "storage"), ("Deployment", "server")):
        pod = pod_templates()[kind]
        spreads = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
        assert set(spreads) == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
        for c in spreads.values():
            assert c["whenUnsatisfiable"] == "ScheduleAnyway"  # small clusters still run
            assert c["labelSelector"] == {"matchLabels": selector(spec, component)}
        term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


def test_the_spec_overrides_the_defaults():
    mine = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
    spread = [{"maxSkew": 2, "topologyKey": "rack", "whenUnsatisfiable": "DoNotSchedule"}]
    pod = pod_templates(
        storage={
            "affinity": mine,
            "topologySpreadConstraints": spread,
            "priorityClassName": "waltz-critical",
        }
    )["StatefulSet"]
    assert pod["affinity"] == mine
    assert [c["topologyKey"] for c in pod["topologySpreadConstraints"]] == ["rack"]
    assert pod["priorityClassName"] == "waltz-critical"


def test_zones_become_groups():
    def node(**labels):
        return {"metadata": {"name": "n", "labels": labels}}

    assert node_zone(node(**{"topology.kubernetes.io/zone": "eu-1b"})) == "eu-1b"
    assert node_zone(node(**{"failure-domain.beta.kubernetes.io/zone": "old"})) == "old"
    assert node_zone(node()) is None
    groups = zone_groups({"s0": "eu-1b", "s1": "eu-1a", "s2": "eu-1b", "s3": None})
    assert groups == {"s0": 2, "s1": 1, "s2": 2, "s3": 0}
    # Only what differs is written, and only for nodes in the assignment.
    assert group_changes({"s0": 2, "s1": 0, "s2": 0}, groups) == {"s1": 1, "s2": 2}


def test_no_pod_is_best_effort_without_resources_in_the_spec():
    for pod in pod_templates().values():
        resources = pod["containers"][0]["resources"]
        assert resources["requests"]["cpu"] and resources["requests"]["memory"]
        assert resources["limits"]["memory"]
    given = {"requests": {"cpu": "2"}}
    assert (
        pod_templates(storage={"resources": given})["StatefulSet"]["containers"][0]["resources"]
        == given
    )
