"""The order of an upgrade: the storage nodes first, then the servers. Pure.

New storage nodes serve old servers, but new servers may refuse older storage nodes (the
release that adds commit times: a server of storage protocol 3 leaves a storage node
older than that out of a partition's replica session). The operator rolls the storage
pods one at a time (rollout.py), while a Deployment would roll every server to the new
image at once: the partitions would lose their quorum until the storage roll ended. So,
as Strimzi and CloudNativePG sequence their rolls, the server Deployment keeps the image
its servers run while the storage nodes are upgraded, and gets the new one once every
storage pod runs the new storage image, on the StatefulSet's current revision, ready.
Everything else of the Deployment (replicas, settings, resources) applies at once: only
the image waits.

The decision comes from what is live (the Deployment, the pods), never from memory: an
operator restarted half-way takes it up where it was. It is about images differing, not
versions: a downgrade goes in the same order. A cluster being created (no Deployment
yet) gets the wanted image at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SERVER_CONTAINER = "server"
STORAGE_CONTAINER = "storage"


@dataclass(frozen=True)
class StoragePod:
    """One storage pod the StatefulSet wants, as it runs: its storage container's image
    and its revision (both None: missing, or being deleted to be made again)."""

    name: str
    image: str | None
    revision: str | None  # its controller-revision-hash
    ready: bool


@dataclass(frozen=True)
class ServerDeployment:
    """The server Deployment to apply. ``held``: its servers keep the image they run, and
    why (None: nothing held); ``released``: the image they now roll to, the storage nodes
    being upgraded (None: no upgrade ends here)."""

    obj: Mapping[str, Any]
    held: str | None = None
    released: str | None = None


def container_image(workload: Mapping[str, Any] | None, container: str) -> str | None:
    """The image of the named container of a Deployment's, a StatefulSet's or a pod's
    spec (None: no workload, or no such container)."""
    spec = (workload or {}).get("spec") or {}
    if "template" in spec:  # a workload; else a pod
        spec = (spec.get("template") or {}).get("spec") or {}
    for c in spec.get("containers") or []:
        if c.get("name") == container:
            image = c.get("image")
            return str(image) if image else None
    return None


def with_container_image(workload: Mapping[str, Any], container: str, image: str) -> dict[str, Any]:
    """The workload with that container's image replaced (a copy along the path)."""
    spec = dict(workload["spec"])
    template = dict(spec["template"])
    pod = dict(template["spec"])
    pod["containers"] = [
        {**c, "image": image} if c.get("name") == container else c for c in pod["containers"]
    ]
    template["spec"] = pod
    spec["template"] = template
    return {**workload, "spec": spec}


def image_changing(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    """Whether applying the desired server Deployment would change the image its servers
    run (not when there is no Deployment yet)."""
    running = container_image(live, SERVER_CONTAINER)
    return running is not None and running != container_image(desired, SERVER_CONTAINER)


def storage_behind(
    storage_image: str, revision: str | None, pods: Sequence[StoragePod]
) -> list[str]:
    """Why the storage nodes are not all upgraded yet, pod by pod (empty: every pod runs
    ``storage_image`` on the StatefulSet's update revision, and is ready)."""
    if revision is None:
        return ["the storage StatefulSet reports no revision yet"]
    behind = []
    for pod in pods:
        if pod.image is None:
            behind.append(f"{pod.name} is being replaced")
        elif pod.image != storage_image:
            behind.append(f"{pod.name} runs {pod.image}")
        elif pod.revision != revision:
            behind.append(f"{pod.name} is not on the StatefulSet's revision {revision}")
        elif not pod.ready:
            behind.append(f"{pod.name} is not ready")
    return behind


def servers_to_apply(
    desired: Mapping[str, Any],
    live: Mapping[str, Any] | None,
    storage_image: str,
    revision: str | None,
    pods: Sequence[StoragePod],
) -> ServerDeployment:
    """The server Deployment to apply: the desired one, but with the image the live one
    runs while its image would change and a storage pod does not yet run
    ``storage_image`` ready on ``revision`` (the StatefulSet's update revision).
    ``pods``: every storage pod the StatefulSet wants."""
    if not image_changing(desired, live):
        return ServerDeployment(desired)
    wanted = container_image(desired, SERVER_CONTAINER)
    assert wanted is not None
    behind = storage_behind(storage_image, revision, pods)
    if not behind:
        return ServerDeployment(desired, released=wanted)
    running = container_image(live, SERVER_CONTAINER)
    assert running is not None
    done = sum(1 for p in pods if not storage_behind(storage_image, revision, [p]))
    return ServerDeployment(
        with_container_image(desired, SERVER_CONTAINER, running),
        held=(
            f"upgrading: servers wait for the storage nodes to run {storage_image} "
            f"({done}/{len(pods)} do; {'; '.join(behind)}); the servers keep {running} "
            f"until then"
        ),
    )
