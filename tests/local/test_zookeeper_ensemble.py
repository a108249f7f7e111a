"""ZooKeeperEnsemble: three real ZooKeeper JVMs forming one quorum on this host (the
ZooKeeper column of ``waltz bench --compare``, replicated like a waltz partition)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_zookeeper import kazoo, require_zookeeper

from waltz_client.tools.local.zookeeper import (
    QUORUM_MAIN,
    SERVER_MAIN,
    EmbeddedZooKeeper,
    four_letter_word,
)
from waltz_client.tools.local.zookeeper_ensemble import ZooKeeperEnsemble


def mode(member: EmbeddedZooKeeper) -> str:
    reply = four_letter_word(member.host, member.port, "srvr", 5.0) or ""
    return next((line.split(": ")[1] for line in reply.splitlines() if "Mode" in line), "")


def test_each_member_is_configured_as_one_of_the_quorum(tmp_path: Path) -> None:
    ensemble = ZooKeeperEnsemble(str(tmp_path), 3)
    lines = {m.quorum[m.server_id] for m in ensemble.members if m.quorum}
    assert len(lines) == 3  # its own quorum and election ports each
    ports = [int(p) for line in lines for p in line.split(":")[1:]]
    ports += [m.port for m in ensemble.members]
    assert len(set(ports)) == 9
    first = ensemble.members[0]
    assert QUORUM_MAIN in first.command_line("java", "cp")
    Path(first.data_dir).mkdir(parents=True)  # start() makes it
    first._write_config()
    config = Path(first.config_path).read_text()
    for i, member in enumerate(ensemble.members, start=1):
        assert f"server.{i}={first.quorum[i]}\n" in config  # type: ignore[index]
        assert member.server_id == i
    assert Path(first.data_dir, "myid").read_text() == "1\n"
    assert ensemble.connect_string.count(",") == 2


def test_one_member_is_a_standalone_server(tmp_path: Path) -> None:
    (only,) = ZooKeeperEnsemble(str(tmp_path), 1).members
    assert only.quorum is None and SERVER_MAIN in only.command_line("java", "cp")


def test_a_member_must_be_in_its_quorum(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="server_id 4"):
        EmbeddedZooKeeper(str(tmp_path), 2181, server_id=4, quorum={1: "h:1:2", 2: "h:3:4"})
    with pytest.raises(ValueError, match="at least 1 member"):
        ZooKeeperEnsemble(str(tmp_path), 0)


def test_three_members_replicate_and_survive_one_loss(tmp_path: Path) -> None:
    require_zookeeper()
    ensemble = ZooKeeperEnsemble(str(tmp_path), 3)
    ensemble.start()
    try:
        assert len(ensemble.pids) == 3
        assert sorted(mode(m) for m in ensemble.members) == ["follower", "follower", "leader"]
        first, second, third = ensemble.members
        with kazoo(first.connect_string) as a:
            a.create("/written-on-one", b"hello")
        with kazoo(third.connect_string) as c:
            c.sync("/written-on-one")
            assert c.get("/written-on-one")[0] == b"hello"
        # A majority (2 of 3) still commits; one member alone would not.
        ensemble.members[0].kill()
        with kazoo(f"{second.connect_string},{third.connect_string}", timeout=20) as b:
            b.create("/after-one-loss", b"still")
            assert b.get("/written-on-one")[0] == b"hello"
    finally:
        ensemble.stop()
    assert ensemble.pids == []
