"""A process whose ZooKeeper is gone exits, even with a kazoo callback stuck reading it
and the client never closed (an application that crashed). kazoo retries a watch's read
forever and joins its callback thread at exit: without stopping the client first, the
exit hung for good (seen when `waltz bench` failed after its cluster had stopped)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from waltz_client.tools.local.zookeeper import EmbeddedZooKeeper

pytestmark = pytest.mark.timeout(120)

STUCK = textwrap.dedent(
    """
    import sys, time
    from kazoo.protocol.states import Callback
    from waltz_client.cluster.zk import connect

    zk = connect(sys.argv[1], session_timeout=4.0)
    zk.ensure_path("/x")
    print("ready", flush=True)
    sys.stdin.readline()  # ZooKeeper is killed meanwhile
    # What a DataWatch does when its node changes: a retried read, on kazoo's thread.
    zk.handler.dispatch_callback(Callback("watch", lambda: zk.retry(zk.get, "/x"), ()))
    time.sleep(0.5)
    raise SystemExit(3)  # without closing the client
    """
)


def test_exit_with_zookeeper_gone_and_a_callback_stuck(tmp_path, zookeeper_available):
    zookeeper = EmbeddedZooKeeper(str(tmp_path / "zk"))
    zookeeper.start()
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    process = subprocess.Popen(
        [sys.executable, str(script), zookeeper.connect_string],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout.readline().strip() == "ready"
        zookeeper.kill()
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.wait(60) == 3  # hung forever before
    finally:
        if process.poll() is None:
            process.kill()
        zookeeper.stop()
