"""Changing a running cluster's storage volumes (volumes.py): the plan from the live
StatefulSet, the desired one and the claims; refusals name the field."""

from __future__ import annotations

import copy
from decimal import Decimal

import pytest

from waltz_operator.desired import desired_objects
from waltz_operator.spec import parse
from waltz_operator.volumes import (
    ClaimPatch,
    Recreate,
    RefuseVolumeChange,
    needs_restart_to_resize,
    plan_volume_change,
    quantity,
    resizing,
)


def statefulset(**storage) -> dict:
    doc = {
        "apiVersion": "waltz.io/v1alpha1",
        "kind": "WaltzCluster",
        "metadata": {"name": "demo", "namespace": "prod", "uid": "u1"},
        "spec": {"zookeeper": {"connect": "zk:2181"}, "storage": {"size": "10Gi", **storage}},
    }
    return next(o for o in desired_objects(parse(doc)) if o["kind"] == "StatefulSet")


def claim(ordinal: int, size: str = "10Gi", labels=None, capacity=None, conditions=()) -> dict:
    template = statefulset()["spec"]["volumeClaimTemplates"][0]
    c = {
        "metadata": {
            "name": f"data-demo-storage-{ordinal}",
            "labels": dict(template["metadata"]["labels"] if labels is None else labels),
        },
        "spec": {**copy.deepcopy(template["spec"]), "resources": {"requests": {"storage": size}}},
        "status": {"conditions": list(conditions)},
    }
    if capacity:
        c["status"]["capacity"] = {"storage": capacity}
    return c


@pytest.mark.parametrize(
    ("text", "value"),
    [("10Gi", 10 * 2**30), ("1.5Ti", Decimal("1.5") * 2**40), ("500M", 5 * 10**8), ("1e3", 1000)],
)
def test_quantities(text, value):
    assert quantity(text) == value


def test_a_bad_quantity_is_named():
    with pytest.raises(ValueError, match="'ten gigs'"):
        quantity("ten gigs")


def test_the_same_template_is_no_change():
    live = statefulset()
    # The API server fills in fields of its own: no change of ours.
    live["spec"]["volumeClaimTemplates"][0]["spec"]["volumeMode"] = "Filesystem"
    assert plan_volume_change(live, statefulset(), [claim(0), claim(1), claim(2)]) is None


def test_growing_patches_every_smaller_claim_then_recreates():
    plan = plan_volume_change(
        statefulset(), statefulset(size="20Gi"), [claim(0), claim(1, "20Gi"), claim(2)]
    )
    assert isinstance(plan, Recreate)
    assert "size 10Gi to 20Gi" in plan.reason
    grow = {"spec": {"resources": {"requests": {"storage": "20Gi"}}}}
    assert plan.patches == (
        ClaimPatch("data-demo-storage-0", grow),
        ClaimPatch("data-demo-storage-2", grow),
    )


def test_new_labels_reach_the_claims():
    live = statefulset()
    del live["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"]["waltz.io/cluster"]
    old_labels = dict(live["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"])
    plan = plan_volume_change(live, statefulset(), [claim(0, labels=old_labels)])
    assert isinstance(plan, Recreate) and plan.reason.endswith("labels")
    assert plan.patches == (
        ClaimPatch("data-demo-storage-0", {"metadata": {"labels": {"waltz.io/cluster": "demo"}}}),
    )


def test_shrinking_is_refused_naming_the_field():
    plan = plan_volume_change(statefulset(size="20Gi"), statefulset(size="10Gi"), [claim(0)])
    assert isinstance(plan, RefuseVolumeChange)
    assert plan.reason.startswith("spec.storage.size cannot shrink (20Gi to 10Gi)")


@pytest.mark.parametrize(
    ("live_class", "wanted_class", "claim_class", "refused"),
    [
        ("fast", "slow", "fast", True),
        ("fast", None, "fast", True),
        (None, "slow", "fast", True),  # the default class was fast
        (None, "fast", "fast", False),  # naming the default class the claims have
    ],
)
def test_the_storage_class_cannot_move(live_class, wanted_class, claim_class, refused):
    live = statefulset(**({"storageClassName": live_class} if live_class else {}))
    wanted = statefulset(**({"storageClassName": wanted_class} if wanted_class else {}))
    c = claim(0)
    c["spec"]["storageClassName"] = claim_class
    plan = plan_volume_change(live, wanted, [c])
    if refused:
        assert isinstance(plan, RefuseVolumeChange)
        assert plan.reason.startswith("spec.storage.storageClassName cannot change in place")
    else:
        assert isinstance(plan, Recreate) and plan.patches == ()


def test_resizing_and_remounting():
    growing = claim(0, "20Gi", capacity="10Gi")
    pending = claim(
        1,
        "20Gi",
        capacity="10Gi",
        conditions=[{"type": "FileSystemResizePending", "status": "True"}],
    )
    done = claim(2, "20Gi", capacity="20Gi")
    assert resizing([growing, pending, done]) == ["data-demo-storage-0"]
    assert [needs_restart_to_resize(c) for c in (growing, pending, done)] == [False, True, False]
