"""``waltz local up``: a whole cluster on this machine, until Ctrl-C."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import threading

from waltz_client.cluster.errors import ClusterError

from .cluster import HOST, LocalCluster, LocalClusterError
from .processes import ProcessFailed
from .zookeeper import ZooKeeperUnavailable


def register(groups: argparse._SubParsersAction) -> None:
    local = groups.add_parser("local", help="a local cluster for development and tests")
    cmds = local.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = cmds.add_parser("up", help="start ZooKeeper, storage nodes and servers; Ctrl-C stops them")
    p.add_argument(
        "--data-dir",
        default=".waltz-local/cluster",
        help="state directory, kept across runs (default .waltz-local/cluster)",
    )
    p.add_argument("--storages", type=int, default=3, help="storage nodes (default 3)")
    p.add_argument("--partitions", type=int, default=4, help="partitions (default 4)")
    p.add_argument("--replicas", type=int, default=3, help="replicas (default 3)")
    p.add_argument("--servers", type=int, default=2, help="servers (default 2)")
    p.add_argument("--name", default="local", help="cluster name (default local)")
    add_security_flags(p)
    p.set_defaults(func=cmd_up)


def add_security_flags(p: argparse.ArgumentParser) -> None:
    """``--insecure``, and ``--tls``, the default since issue 39 (kept so that scripts
    that pass it still run)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--insecure",
        action="store_true",
        help="plain text everywhere and an open ZooKeeper ACL (default: mutual TLS with a "
        "throw-away CA in <data dir>/pki/, and ZooKeeper ACLs)",
    )
    group.add_argument(
        "--tls", action="store_true", help="deprecated, does nothing: TLS is the default"
    )


def cmd_up(args: argparse.Namespace) -> int:
    def say(message: str) -> None:
        print(f"[waltz local] {message}", flush=True)

    try:
        cluster = LocalCluster(
            args.data_dir,
            storages=args.storages,
            partitions=args.partitions,
            replicas=args.replicas,
            name=args.name,
            servers=args.servers,
            tls=not args.insecure,
        )
        cluster.start(say)
    except (LocalClusterError, ZooKeeperUnavailable, ProcessFailed, ClusterError) as e:
        print(f"waltz local: error: {e}", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    say(f"ready. ZooKeeper: {cluster.zookeeper_connect}, cluster root {cluster.layout.root}")
    say(f"  admin commands (waltz cluster show, grant, ...) after: {admin_environment(cluster)}")
    if cluster.client_tls is not None:
        tls = cluster.client_tls
        say(f"  TLS: clients use cert {tls.cert}, key {tls.key}, CA {tls.ca}")
        say(
            "  a client: WaltzClientConfig(os.environ['WALTZ_ZOOKEEPER'], "
            f"zk_root={cluster.layout.root!r}, tls=files, zk_tls=files) with "
            f"files = TlsFiles({str(tls.cert)!r}, {str(tls.key)!r}, {str(tls.ca)!r})"
        )
    else:
        say(
            "  PLAIN TEXT (--insecure): no TLS and an open ZooKeeper ACL: any user of this "
            f"machine can use every port on {HOST} and write the metadata"
        )
    say(f"  data and logs in {cluster.data_dir}; Ctrl-C stops everything")
    try:
        while not done.wait(1.0):
            for proc in [*cluster.storages, *cluster.servers]:
                if not proc.running:
                    say(
                        f"{proc.name} exited ({proc.proc.returncode if proc.proc else '?'}); "
                        f"restarting. Log: {proc.log_path}"
                    )
                    try:
                        proc.start()
                    except ProcessFailed as e:
                        say(str(e))
    finally:
        say("stopping")
        cluster.stop()
        say("stopped")
    return 0


def admin_environment(cluster: LocalCluster) -> str:
    """The ``export`` line that points ``waltz cluster`` at this cluster as its admin
    (with TLS: the admin certificate and the metadata's write credential)."""
    env = {"WALTZ_ZOOKEEPER": cluster.zookeeper_connect, "WALTZ_ROOT": cluster.layout.root}
    if cluster.zk_auth_file:
        env["WALTZ_ZK_AUTH_FILE"] = cluster.zk_auth_file
    admin = cluster.zk_tls()
    if admin is not None:
        env |= {
            "WALTZ_ZK_TLS_CERT": str(admin.cert),
            "WALTZ_ZK_TLS_KEY": str(admin.key),
            "WALTZ_ZK_TLS_CA": str(admin.ca),
        }
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
