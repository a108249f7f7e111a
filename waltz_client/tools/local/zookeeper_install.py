"""Where a local ZooKeeper server comes from: a ``java`` executable (17 or later) and a
class path holding ZooKeeper's server jars, from ``$ZOOKEEPER_HOME`` (an Apache
ZooKeeper binary release) or the ``jars/`` directory of an installed pyspark wheel."""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil

# The server jar itself (zookeeper-3.9.5.jar), not zookeeper-jute-*.jar.
_SERVER_JAR_PATTERN = "zookeeper-[0-9]*.jar"


class ZooKeeperUnavailable(RuntimeError):
    """ZooKeeper cannot be started here; the message says what is missing and how to get it."""


def find_java(java: str | None = None) -> str:
    """The path of a ``java`` executable: ``java`` if given, else ``$JAVA_HOME/bin/java``,
    else ``java`` on ``PATH``. Raises :class:`ZooKeeperUnavailable` if there is none."""
    if java:
        found = java if os.sep in java else shutil.which(java)
        if found and _is_executable(found):
            return found
        raise ZooKeeperUnavailable(f"java not found or not executable at {java!r}; install Java 17")
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        if _is_executable(candidate):
            return candidate
    found = shutil.which("java")
    if found and _is_executable(found):
        return found
    where = f"PATH or JAVA_HOME ({java_home}/bin/java)" if java_home else "PATH or JAVA_HOME"
    raise ZooKeeperUnavailable(
        f"java not found on {where}; install Java 17 "
        "(e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
    )


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_zookeeper_classpath() -> str:
    """A Java class path holding ZooKeeper's server: ``$ZOOKEEPER_HOME/lib/*`` and
    ``$ZOOKEEPER_HOME/*`` if ``ZOOKEEPER_HOME`` is set, else pyspark's ``jars/*``.
    Raises :class:`ZooKeeperUnavailable` if no ``zookeeper-<version>.jar`` is there."""
    home = os.environ.get("ZOOKEEPER_HOME")
    if home:
        dirs = [d for d in (os.path.join(home, "lib"), home) if os.path.isdir(d)]
        if not any(glob.glob(os.path.join(d, _SERVER_JAR_PATTERN)) for d in dirs):
            raise ZooKeeperUnavailable(
                f"no ZooKeeper jars in ZOOKEEPER_HOME={home} (no lib/zookeeper-<version>.jar): "
                "point it at an Apache ZooKeeper binary release, or unset it and "
                "pip install 'waltz[local]' (pyspark ships the jars)"
            )
        return os.pathsep.join(os.path.join(d, "*") for d in dirs)

    jars = _pyspark_jars_dir()
    if jars is None:
        raise ZooKeeperUnavailable(
            "no ZooKeeper jars: pip install 'waltz[local]' (pyspark ships them) "
            "or set ZOOKEEPER_HOME to an Apache ZooKeeper binary release"
        )
    if not glob.glob(os.path.join(jars, _SERVER_JAR_PATTERN)):
        raise ZooKeeperUnavailable(
            f"no ZooKeeper jars: {jars} has no zookeeper-<version>.jar (pyspark-client and "
            "pyspark-connect ship no jars); pip install 'waltz[local]' for the full pyspark, "
            "or set ZOOKEEPER_HOME to an Apache ZooKeeper binary release"
        )
    return os.path.join(jars, "*")


def _pyspark_jars_dir() -> str | None:
    """pyspark's ``jars`` directory, found without importing pyspark."""
    try:
        spec = importlib.util.find_spec("pyspark")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        base = next(iter(spec.submodule_search_locations))
    elif spec.origin:
        base = os.path.dirname(spec.origin)
    else:
        return None
    return os.path.join(base, "jars")
