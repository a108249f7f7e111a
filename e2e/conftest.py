"""End-to-end on kind: a real Kubernetes cluster, the images built from this repository,
the chart installed with helm. Runs where Docker and kind exist (the GitHub Actions
workflow .github/workflows/e2e.yaml); skipped elsewhere with a one-line reason.

Set WALTZ_E2E_KEEP=1 to keep the kind cluster after the run (for debugging), and
WALTZ_E2E_REUSE=1 to reuse one that exists.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from .kube import Kube

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLUSTER = "waltz-e2e"
TAG = "e2e"
REPOSITORY = "ghcr.io/waltz-io"
IMAGES = ("storage", "server", "operator", "spark")


def _missing() -> str | None:
    for tool in ("docker", "kind"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH: the kind end-to-end tests run where Docker and kind exist"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "the Docker engine does not answer: the kind end-to-end tests need one"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _missing()
    for item in items:
        if "e2e" in str(item.fspath.dirpath()):
            item.add_marker(pytest.mark.e2e)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


def run(*command: str, timeout: float = 900, **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(command), flush=True)
    return subprocess.run(command, check=True, timeout=timeout, cwd=ROOT, **kwargs)


@pytest.fixture(scope="session")
def kind_cluster():
    """A kind cluster with this repository's images loaded."""
    existing = subprocess.run(["kind", "get", "clusters"], capture_output=True, text=True)
    reuse = os.environ.get("WALTZ_E2E_REUSE") and CLUSTER in existing.stdout.split()
    if not reuse:
        if CLUSTER in existing.stdout.split():
            run("kind", "delete", "cluster", "--name", CLUSTER)
        run("kind", "create", "cluster", "--config", "e2e/kind.yaml", "--wait", "300s")
    run("make", "images", f"IMAGE_REPOSITORY={REPOSITORY}", f"IMAGE_TAG={TAG}", timeout=3600)
    for image in IMAGES:
        run("kind", "load", "docker-image", f"{REPOSITORY}/waltz-{image}:{TAG}", "--name", CLUSTER)
    try:
        yield Kube(context=f"kind-{CLUSTER}")
    finally:
        if not os.environ.get("WALTZ_E2E_KEEP"):
            run("kind", "delete", "cluster", "--name", CLUSTER)


def helm(*args: str) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "k8s"))
    from helm_binary import helm_path

    run(helm_path(), *args)


def helm_install(kube: Kube, release: str, namespace: str, *values: str) -> None:
    helm(
        "upgrade",
        "--install",
        release,
        "charts/waltz",
        "--kube-context",
        kube.context,
        "--namespace",
        namespace,
        "--create-namespace",
        "--wait",
        "--timeout",
        "10m",
        "--set",
        f"operator.image.tag={TAG}",
        "--set",
        f"cluster.image.tag={TAG}",
        *values,
    )


@pytest.fixture(scope="session")
def waltz(kind_cluster):
    """The chart installed with a cluster (bundled ZooKeeper), Ready."""
    kube = kind_cluster
    helm_install(
        kube,
        "waltz",
        "waltz",
        "--set",
        "cluster.enabled=true",
        "--set",
        "cluster.storage.size=1Gi",
        "--set",
        "zookeeper.bundled.storage.size=1Gi",
    )
    kube.wait_ready("waltz", "waltz")
    return kube
