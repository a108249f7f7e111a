"""EmbeddedZooKeeper against real ZooKeeper processes (a JVM each) and real kazoo clients."""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from waltz_client.tools.local.held_signals import signals_held as _signals_held
from waltz_client.tools.local.zookeeper import (
    EmbeddedZooKeeper,
    ZooKeeperUnavailable,
    find_java,
    find_zookeeper_classpath,
)


def require_zookeeper() -> None:
    try:
        find_java()
        find_zookeeper_classpath()
    except ZooKeeperUnavailable as exc:
        pytest.skip(f"ZooKeeper unavailable: {exc}")


@contextmanager
def kazoo(hosts: str, timeout: float = 10.0) -> Iterator[KazooClient]:
    client = KazooClient(hosts=hosts, timeout=timeout)
    client.start(timeout=10.0)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # nothing else is left in its process group either


@pytest.fixture
def own_zk(tmp_path: Path) -> Iterator[EmbeddedZooKeeper]:
    """A started server of the test's own, which it may stop, kill or pause."""
    require_zookeeper()
    server = EmbeddedZooKeeper(str(tmp_path / "zk"))
    server.start()
    pid = server.pid
    assert pid is not None
    try:
        yield server
    finally:
        server.stop()
    assert_gone(pid)


# -- the shared server -----------------------------------------------------------


def test_create_and_get(zookeeper: EmbeddedZooKeeper, zk_root: str) -> None:
    assert zookeeper.ruok()
    host, port = zookeeper.connect_string.rsplit(":", 1)
    assert (host, int(port)) == ("127.0.0.1", zookeeper.port)
    with kazoo(zookeeper.connect_string) as zk:
        zk.create(f"{zk_root}/a", b"hello", makepath=True)
        assert zk.get(f"{zk_root}/a")[0] == b"hello"
    # The same node through a chroot client.
    with kazoo(zookeeper.connect_string + zk_root) as zk:
        assert zk.get("/a")[0] == b"hello"
        zk.set("/a", b"again")
    with kazoo(zookeeper.connect_string) as zk:
        assert zk.get(f"{zk_root}/a")[0] == b"again"


def test_ephemeral_node_vanishes_when_its_session_closes(
    zookeeper: EmbeddedZooKeeper, zk_root: str
) -> None:
    with kazoo(zookeeper.connect_string) as observer:
        observer.ensure_path(zk_root)
        owner = KazooClient(hosts=zookeeper.connect_string, timeout=30.0)
        owner.start(timeout=10.0)
        owner.create(f"{zk_root}/lock", b"mine", ephemeral=True)
        assert observer.exists(f"{zk_root}/lock") is not None
        owner.stop()  # closes the session: no waiting for it to expire (30 s)
        owner.close()
        deadline = time.monotonic() + 5.0
        while observer.exists(f"{zk_root}/lock") is not None:
            assert time.monotonic() < deadline, "ephemeral node outlived its closed session"
            time.sleep(0.05)
        # A persistent sibling is unaffected.
        observer.create(f"{zk_root}/kept", b"")
        assert observer.get_children(zk_root) == ["kept"]


def test_chroots_keep_tests_apart(zookeeper: EmbeddedZooKeeper, zk_root: str) -> None:
    other_root = zk_root + "-other"
    with kazoo(zookeeper.connect_string) as zk:
        zk.create(f"{zk_root}/x", b"1", makepath=True)
        zk.create(f"{other_root}/x", b"2", makepath=True)
    with kazoo(zookeeper.connect_string + zk_root) as zk:
        assert zk.get("/x")[0] == b"1"
        assert zk.get_children("/") == ["x"]


# -- servers of their own ------------------------------------------------------------


def test_restart_keeps_data_and_port(own_zk: EmbeddedZooKeeper, zk_root: str) -> None:
    port, old_pid = own_zk.port, own_zk.pid
    with kazoo(own_zk.connect_string) as zk:
        zk.create(f"{zk_root}/persistent", b"survives", makepath=True)
        zk.create(f"{zk_root}/ephemeral", b"", ephemeral=True)
    own_zk.restart()
    assert own_zk.port == port
    assert own_zk.pid not in (None, old_pid)
    assert old_pid is not None
    assert_gone(old_pid)
    with kazoo(own_zk.connect_string) as zk:
        assert zk.get(f"{zk_root}/persistent")[0] == b"survives"
        assert zk.exists(f"{zk_root}/ephemeral") is None


def test_stop_leaves_no_process(own_zk: EmbeddedZooKeeper) -> None:
    pid = own_zk.pid
    assert pid is not None
    os.kill(pid, 0)  # running
    own_zk.stop()
    assert own_zk.pid is None
    assert not own_zk.running
    assert_gone(pid)
    assert not own_zk.ruok(timeout=0.5)
    own_zk.stop()  # idempotent


def test_kill_then_start(own_zk: EmbeddedZooKeeper, zk_root: str) -> None:
    port, pid = own_zk.port, own_zk.pid
    assert pid is not None
    with kazoo(own_zk.connect_string) as zk:
        zk.create(f"{zk_root}/acked", b"before the crash", makepath=True)
    own_zk.kill()
    assert own_zk.pid is None
    assert_gone(pid)
    own_zk.start()
    assert own_zk.port == port
    with kazoo(own_zk.connect_string) as zk:
        assert zk.get(f"{zk_root}/acked")[0] == b"before the crash"


def test_pause_and_resume(own_zk: EmbeddedZooKeeper, zk_root: str) -> None:
    with kazoo(own_zk.connect_string, timeout=20.0) as zk:
        zk.create(f"{zk_root}/n", b"v", makepath=True)
        own_zk.pause()
        try:
            assert own_zk.pid is not None  # paused, not gone
            assert not own_zk.ruok(timeout=0.5)
            with pytest.raises(KazooTimeoutError):
                zk.get_async(f"{zk_root}/n").get(timeout=1.0)
        finally:
            own_zk.resume()
        assert zk.get(f"{zk_root}/n")[0] == b"v"  # the same session goes on
        zk.set(f"{zk_root}/n", b"after")
    assert own_zk.ruok()
    with kazoo(own_zk.connect_string) as zk:
        assert zk.get(f"{zk_root}/n")[0] == b"after"


def test_stop_while_paused(own_zk: EmbeddedZooKeeper) -> None:
    pid = own_zk.pid
    assert pid is not None
    own_zk.pause()
    started = time.monotonic()
    own_zk.stop(timeout=10.0)
    assert time.monotonic() - started < 5.0, "SIGTERM only took effect through SIGKILL"
    assert_gone(pid)


def test_context_manager_and_explicit_port(tmp_path: Path) -> None:
    require_zookeeper()
    port = EmbeddedZooKeeper(str(tmp_path / "probe")).port  # a free port
    with EmbeddedZooKeeper(str(tmp_path / "zk"), port=port) as server:
        pid = server.pid
        assert pid is not None
        assert server.connect_string == f"127.0.0.1:{port}"
        assert (tmp_path / "zk" / "zoo.cfg").read_text().count(f"clientPort={port}\n") == 1
        with kazoo(server.connect_string) as zk:
            assert zk.exists("/") is not None
        # A second server cannot take the same port: it says so instead of hanging.
        with pytest.raises(ZooKeeperUnavailable, match="already listening"):
            EmbeddedZooKeeper(str(tmp_path / "zk2"), port=port).start()
    assert_gone(pid)


# -- what is missing, and failures while starting ------------------------------------


def test_missing_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ZooKeeperUnavailable, match="/nonexistent/java"):
        find_java("/nonexistent/java")
    server = EmbeddedZooKeeper(str(tmp_path / "zk"), java="/nonexistent/java")
    with pytest.raises(ZooKeeperUnavailable, match=r"java not found .*install Java 17"):
        server.start()
    assert server.pid is None
    # Nothing on JAVA_HOME or PATH either.
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("JAVA_HOME", str(empty))
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(ZooKeeperUnavailable, match="java not found on PATH or JAVA_HOME"):
        find_java()


def test_empty_zookeeper_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "zookeeper-home"
    (home / "lib").mkdir(parents=True)
    monkeypatch.setenv("ZOOKEEPER_HOME", str(home))
    with pytest.raises(ZooKeeperUnavailable, match="no ZooKeeper jars in ZOOKEEPER_HOME=") as info:
        find_zookeeper_classpath()
    assert str(home) in str(info.value)
    server = EmbeddedZooKeeper(str(tmp_path / "zk"), java=sys.executable)
    with pytest.raises(ZooKeeperUnavailable, match="no ZooKeeper jars"):
        server.start()
    assert server.pid is None
    # With the server jar in lib/, the class path covers lib/* and the top directory.
    (home / "lib" / "zookeeper-3.9.5.jar").write_bytes(b"")
    assert find_zookeeper_classpath().split(os.pathsep) == [f"{home}/lib/*", f"{home}/*"]


def test_startup_failure_reports_the_log(tmp_path: Path) -> None:
    require_zookeeper()
    empty = tmp_path / "no-jars"
    empty.mkdir()
    server = EmbeddedZooKeeper(str(tmp_path / "zk"), classpath=f"{empty}/*")
    with pytest.raises(ZooKeeperUnavailable, match=r"exited with code 1") as info:
        server.start(timeout=20.0)
    assert "ZooKeeperServerMain" in str(info.value)  # the JVM's complaint, from the log
    assert server.pid is None


def test_interrupts_wait_until_the_child_is_recorded() -> None:
    """While the JVM is spawned and recorded, SIGINT and SIGTERM wait (and then run), so an
    interrupt cannot leave a JVM that ``stop()`` and the exit hook know nothing of."""
    received: list[int] = []

    def record(signum: int, frame: object) -> None:
        received.append(signum)

    previous = {s: signal.signal(s, record) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with _signals_held():
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGINT)
            time.sleep(0.01)  # (a Python handler would have run by now)
            assert received == []
        assert received == [signal.SIGTERM, signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is record
        assert signal.getsignal(signal.SIGTERM) is record
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# -- the command line ---------------------------------------------------------------------

# Hang guards only: on a loaded machine a JVM may take long to start or stop, and every
# wait below ends as soon as what it waits for happens.
HANG_GUARD = 120.0


def command_line(*args: str) -> list[str]:
    """The CLI as a background job of a shell without job control starts it: with SIGINT
    ignored (inherited). It must still stop on SIGINT, however pytest itself was started."""
    cli = shlex.join([sys.executable, "-m", "waltz_client.tools.local.zookeeper", *args])
    return ["/bin/sh", "-c", f"trap '' INT; exec {cli}"]


def read_line(proc: subprocess.Popen[bytes], timeout: float = HANG_GUARD) -> str:
    """The first line of the child's stdout, without hanging if it never comes."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no line on stdout within {timeout:g} s"
        if select.select([fd], [], [], remaining)[0]:
            chunk = os.read(fd, 4096)
            assert chunk, f"stdout closed (exit code {proc.wait(HANG_GUARD)}), read {data!r}"
            data += chunk
    return data.split(b"\n", 1)[0].decode()


def jvms_using(data_dir: Path) -> list[int]:
    """Pids of processes whose command line names ``data_dir`` (the JVM's config is there)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = (Path("/proc") / entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(data_dir).encode() in cmdline and b"waltz_client" not in cmdline:
                found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper does not count)."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def end(proc: subprocess.Popen[bytes], *pids: int) -> None:
    """After a failure: stop the CLI (its SIGTERM handler stops the JVM), then make sure."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(HANG_GUARD)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def test_command_line_serves_until_interrupted(tmp_path: Path) -> None:
    require_zookeeper()
    data_dir = tmp_path / "zk"
    proc = subprocess.Popen(
        command_line("--data-dir", str(data_dir), "--port", "0", "--timeout", str(HANG_GUARD)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        connect_string = read_line(proc)  # printed once ZooKeeper serves: the readiness signal
        host, port = connect_string.rsplit(":", 1)
        assert host == "127.0.0.1"
        jvms = jvms_using(data_dir)
        assert len(jvms) == 1, jvms
        with kazoo(connect_string) as zk:
            zk.create("/from-cli", b"ok")
        proc.send_signal(signal.SIGINT)
        _, err_bytes = proc.communicate(timeout=HANG_GUARD)
    finally:
        end(proc, *jvms_using(data_dir))
    err = err_bytes.decode()
    assert proc.returncode == 0, err
    assert "ZooKeeper stopped" in err
    assert not [pid for pid in jvms if alive(pid)], "the JVM outlived the command"
    probe = EmbeddedZooKeeper(str(data_dir), port=int(port))
    assert not probe.ruok(timeout=0.5)  # nothing answers there any more


def test_command_line_interrupted_while_starting_ends_the_whole_process_group(
    tmp_path: Path,
) -> None:
    require_zookeeper()  # the class path must resolve; "java" is a stand-in that never serves
    started = tmp_path / "started"
    java = tmp_path / "java"
    # The stand-in leaves a child of its own, so only a kill of its process group ends both.
    java.write_text(
        "#!/bin/sh\n"
        "sleep 600 &\n"
        f'echo "$$ $!" > {shlex.quote(str(started))}.tmp\n'
        f"mv {shlex.quote(str(started))}.tmp {shlex.quote(str(started))}\n"
        "exec sleep 600\n"
    )
    java.chmod(0o755)
    proc = subprocess.Popen(
        command_line(
            *("--data-dir", str(tmp_path / "zk"), "--port", "0"),
            *("--java", str(java), "--timeout", "600"),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + HANG_GUARD
        while not started.exists():
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline, "the stand-in java never started"
            time.sleep(0.05)
        pids = [int(p) for p in started.read_text().split()]
        # The command is now waiting for a server that will never answer.
        proc.send_signal(signal.SIGINT)
        out, err_bytes = proc.communicate(timeout=HANG_GUARD)
    finally:
        end(proc, *pids)
    err = err_bytes.decode()
    assert proc.returncode == 0, err
    assert "ZooKeeper stopped" in err
    assert out == b"", "it claimed to serve"
    assert not [pid for pid in pids if alive(pid)], "part of the process group outlived it"
