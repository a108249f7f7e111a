"""End-to-end on kind: a real Kubernetes cluster, the images built from this repository,
the chart installed with helm. Runs where Docker and kind exist (the GitHub Actions
workflow .github/workflows/e2e.yaml); skipped elsewhere with a one-line reason.

Set WALTZ_E2E_KEEP=1 to keep the kind cluster after the run (for debugging), and
WALTZ_E2E_REUSE=1 to reuse one that exists.
"""

from __future__ import annotations

import io
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile

import pytest

from .kube import Kube

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLUSTER = "waltz-e2e"
TAG = "e2e"
REPOSITORY = "ghcr.io/waltz-io"
IMAGES = ("storage", "server", "operator", "spark")
# The images of the previous chart revision (the upgrade test): the daemons and the operator.
PREVIOUS_TAG = "e2e-previous"
PREVIOUS_IMAGES = ("storage", "server", "operator")
CERT_MANAGER = (
    "https://github.com/cert-manager/cert-manager/releases/download/v1.16.2/cert-manager.yaml"
)


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
    load_images(TAG, IMAGES)
    try:
        yield Kube(context=f"kind-{CLUSTER}")
    finally:
        if not os.environ.get("WALTZ_E2E_KEEP"):
            run("kind", "delete", "cluster", "--name", CLUSTER)


def helm(*args: str) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "k8s"))
    from helm_binary import helm_path

    run(helm_path(), *args)


def load_images(tag: str, components: tuple[str, ...]) -> None:
    for component in components:
        image = f"{REPOSITORY}/waltz-{component}:{tag}"
        run("kind", "load", "docker-image", image, "--name", CLUSTER)


def helm_install(
    kube: Kube,
    release: str,
    namespace: str,
    *values: str,
    chart: str = "charts/waltz",
    tag: str = TAG,
) -> None:
    """``helm upgrade --install`` of ``chart`` (this tree's by default) with the images
    tagged ``tag``, waiting for it."""
    helm(
        "upgrade",
        "--install",
        release,
        chart,
        "--kube-context",
        kube.context,
        "--namespace",
        namespace,
        "--create-namespace",
        "--wait",
        "--timeout",
        "10m",
        "--set",
        f"operator.image.tag={tag}",
        "--set",
        f"cluster.image.tag={tag}",
        *values,
    )


def helm_uninstall(kube: Kube, release: str, namespace: str) -> None:
    """``helm uninstall --wait``, with the time the pre-delete hook may take (the operator's
    teardown of a WaltzCluster with retainVolumes false)."""
    helm(
        "uninstall",
        release,
        "--namespace",
        namespace,
        "--kube-context",
        kube.context,
        "--wait",
        "--timeout",
        "10m",
    )


def remove_release(kube: Kube, release: str, namespace: str) -> None:
    """Clean-up after a test with a release of its own: never raises (the test's own
    failure, if any, is the one to see)."""
    try:
        helm_uninstall(kube, release, namespace)
    except Exception as e:
        print(f"helm uninstall {release}: {e}", flush=True)
    kube("delete", "namespace", namespace, "--ignore-not-found", "--wait=false", check=False)


def _git(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=ROOT, check=check, capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _chart_version(revision: str | None) -> str:
    """charts/waltz/Chart.yaml's ``version`` at ``revision`` (None: the working tree)."""
    if revision is None:
        text = (ROOT / "charts" / "waltz" / "Chart.yaml").read_text()
    else:
        text = _git("show", f"{revision}:charts/waltz/Chart.yaml", check=False)
    for line in text.splitlines():
        if line.startswith("version:"):
            return line.split(":", 1)[1].strip().strip("\"'")
    return ""


def previous_chart_revision() -> str:
    """The revision whose chart (and images) the upgrade test starts from, the first of:
    $WALTZ_E2E_UPGRADE_FROM; the newest release tag before HEAD; the last revision of
    the chart version before the current one; HEAD when the working tree changes
    charts/waltz; else the parent of the last commit that changed charts/waltz (the chart
    as it was before its latest change)."""
    if os.environ.get("WALTZ_E2E_UPGRADE_FROM"):
        return os.environ["WALTZ_E2E_UPGRADE_FROM"]
    changed = bool(_git("status", "--porcelain", "--", "charts/waltz"))
    head = _git("rev-parse", "HEAD")
    tag = _git("describe", "--tags", "--abbrev=0", "HEAD", check=False)
    if tag and not changed and _git("rev-parse", f"{tag}^{{commit}}") == head:
        tag = _git("describe", "--tags", "--abbrev=0", "HEAD~1", check=False)  # not itself
    if tag and _chart_version(tag):
        return _git("rev-parse", f"{tag}^{{commit}}")
    current, introduced = _chart_version(None), None
    for commit in _git("log", "--format=%H", "--", "charts/waltz/Chart.yaml").split():
        if _chart_version(commit) == current:
            introduced = commit  # the current version, as far back as it goes
        elif introduced:
            return _git("rev-parse", f"{introduced}~1", check=False)  # the version before
    if changed:
        return head
    last = _git("log", "-1", "--format=%H", "--", "charts/waltz")
    return _git("rev-parse", f"{last}~1", check=False) if last else ""


def checkout(revision: str) -> pathlib.Path:
    """The tree of ``revision`` extracted to a new temporary directory (git archive: no
    worktree to clean up in the repository)."""
    if not revision:
        raise AssertionError(
            "no previous chart revision found: a shallow clone? (the workflow checks out "
            "with fetch-depth: 0; or set WALTZ_E2E_UPGRADE_FROM)"
        )
    tree = pathlib.Path(tempfile.mkdtemp(prefix="waltz-e2e-previous-"))
    archive = subprocess.run(
        ["git", "archive", "--format=tar", revision], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    if not (tree / "charts" / "waltz" / "Chart.yaml").exists():
        raise AssertionError(f"revision {revision} has no charts/waltz")
    return tree


def build_images(tree: pathlib.Path, tag: str, components: tuple[str, ...]) -> None:
    """``make images`` of another tree, only ``components``, loaded into kind."""
    dockerfiles = {
        "storage": "images/storage/Dockerfile",
        "server": "images/server/Dockerfile",
        "operator": "operator/Dockerfile",
        "spark": "images/spark/Dockerfile",
    }
    run(
        "make",
        "-C",
        str(tree),
        "images",
        f"IMAGE_REPOSITORY={REPOSITORY}",
        f"IMAGE_TAG={tag}",
        "IMAGE_DOCKERFILES=" + " ".join(f"{c}={dockerfiles[c]}" for c in components),
        timeout=3600,
    )
    load_images(tag, components)


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


@pytest.fixture(scope="session")
def cert_manager(kind_cluster):
    """cert-manager installed and answering."""
    kube = kind_cluster
    kube("apply", "-f", CERT_MANAGER)
    kube(
        "wait",
        "--for=condition=Available",
        "deployment",
        "--all",
        "-n",
        "cert-manager",
        "--timeout=300s",
    )
    return kube


@pytest.fixture(scope="session")
def secure(cert_manager):
    """The chart in namespace ``secure``: mutual TLS from cert-manager and network
    policies, Ready; uninstalled at the end."""
    kube = cert_manager
    helm_install(
        kube,
        "secure",
        "secure",
        "--set",
        "cluster.enabled=true",
        "--set",
        "cluster.certManager.enabled=true",
        "--set",
        "cluster.storage.size=1Gi",
        "--set",
        "zookeeper.bundled.storage.size=1Gi",
        "--set",
        "networkPolicy.enabled=true",
    )
    kube.wait_ready("secure", "waltz")
    yield kube
    remove_release(kube, "secure", "secure")
