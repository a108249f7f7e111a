"""The ``waltz fuzz`` command: a throw-away local cluster (``cluster``), or a running
daemon (``--target``), or one suspect connection sent again (``--replay``).
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import uuid

from waltz_client.runtime import event_loop
from waltz_client.runtime.tls import TlsFiles

from .client_check import ClientCheck, check_client
from .cluster import fuzz_cluster
from .connections import Endpoint, FuzzStats, TlsDial, fuzz_target, probe, run_connection
from .frames import PROTOCOLS, FuzzTarget
from .plans import plan_connection
from .report import describe_stats, every_ten_probes


def register(groups: argparse._SubParsersAction) -> None:
    p = groups.add_parser(
        "fuzz",
        help="fuzz the storage and server protocols, then check a client is served",
        description="Send mutated frames to a storage node and a server (a throw-away "
        "local cluster by default, or --target), report frames/s, crashes and RSS, then "
        "check that a well-behaved client still appends and reads back. Exit status 1 if "
        "a daemon exited or stopped answering, or the client check failed.",
    )
    p.add_argument("--frames", type=int, default=1_000_000, help="per daemon (default 1e6)")
    p.add_argument("--seed", type=int, default=1, help="the same seed sends the same bytes")
    p.add_argument("--concurrency", type=int, default=16, help="connections at once")
    p.add_argument("--reply-timeout", type=float, default=0.5, help="seconds to wait for replies")
    p.add_argument("--data-dir", default=".waltz-local/fuzz", help="local cluster; wiped")
    p.add_argument("--partitions", type=int, default=4, help="local cluster (default 4)")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="local cluster in plain text (default: mutual TLS, and mutated TLS handshakes)",
    )
    p.add_argument("--target", metavar="HOST:PORT", help="fuzz this running daemon instead")
    p.add_argument("--protocol", choices=PROTOCOLS, help="with --target: what it speaks")
    p.add_argument("--pid", type=int, help="with --target: its process, for alive and RSS")
    p.add_argument("--zookeeper", help="with --target: the cluster's ZooKeeper (key, client)")
    p.add_argument("--zk-root", default="/waltz", help="with --zookeeper (default /waltz)")
    p.add_argument("--cluster-key", type=uuid.UUID, help="with --target storage: for Open")
    p.add_argument("--num-partitions", type=int, help="with --target: partitions to aim at")
    p.add_argument("--tls-cert", help="with --target: the port speaks TLS; dial with this cert")
    p.add_argument("--tls-key", help="with --tls-cert: its key")
    p.add_argument("--tls-ca", help="with --target: the CA the daemon's certificate chains to")
    p.add_argument("--tls-server-name", help="with --tls-ca: the name to check (default HOST)")
    p.add_argument(
        "--no-replay-sessions",
        dest="replay_sessions",
        action="store_false",
        help="storage: never send a live session ID (a stranger, not a peer reading ZooKeeper)",
    )
    p.add_argument(
        "--replay", type=int, metavar="CONNECTION_SEED", help="send one suspect connection"
    )
    p.set_defaults(func=cmd_fuzz)


def cmd_fuzz(args: argparse.Namespace) -> int:
    if args.frames < 1 or args.concurrency < 1 or args.partitions < 1:
        print("waltz fuzz: error: --frames, --concurrency and --partitions must be at least 1")
        return 2
    if args.target is not None:
        return _cmd_target(args)
    if args.protocol or args.pid or args.replay is not None:
        print("waltz fuzz: error: --protocol, --pid and --replay need --target")
        return 2
    return _cmd_local(args)


def _cmd_local(args: argparse.Namespace) -> int:
    from waltz_client.tools.demo.common import fresh_cluster

    cluster = fresh_cluster(args.data_dir, args.partitions, 1, [], tls=not args.insecure)
    print(
        f"starting a local cluster: 3 storage nodes, 1 server, {args.partitions} partitions, "
        + ("plain text" if args.insecure else "mutual TLS")
    )
    cluster.start()
    try:
        result = event_loop.run(
            fuzz_cluster(
                cluster,
                frames=args.frames,
                seed=args.seed,
                concurrency=args.concurrency,
                reply_timeout=args.reply_timeout,
                replay_sessions=args.replay_sessions,
                announce=lambda line: print(line, flush=True),
            )
        )
    finally:
        cluster.stop()
    for name, lines in result.logged_errors.items():
        print(f"{name} logged {len(lines)} error line(s) while fuzzed; the first:")
        print("\n".join(f"  {line}" for line in lines[:5]))
    if not result.check.ok:  # why the client was not served is in the server's log
        for proc in cluster.servers:
            tail = [line for line in proc.log_tail(400).splitlines() if "closing" not in line]
            print(f"{proc.name} log, the last lines (peer warnings left out):")
            print("\n".join(f"  {line}" for line in tail[-6:]))
    return _verdict(result.stats, result.check, result.dead)


def _verdict(results: list[FuzzStats], check: ClientCheck | None, dead: list[str]) -> int:
    if check is None:
        print("well-behaved client: not checked (no --zookeeper)")
    else:
        verdict = "served" if check.ok else "FAILED"
        print(
            f"well-behaved client: {verdict}: {check.committed} appended, "
            f"{check.read_back} read back ({check.detail})"
        )
    if dead:
        print(f"daemons that exited: {', '.join(dead)}")
    ok = not dead and not any(s.failed for s in results) and (check is None or check.ok)
    print(f"result: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def _cmd_target(args: argparse.Namespace) -> int:
    if args.protocol is None:
        print("waltz fuzz: error: --target needs --protocol server|storage")
        return 2
    host, _, port = args.target.rpartition(":")
    if not host or not port.isdigit():
        print(f"waltz fuzz: error: --target {args.target!r}: expected HOST:PORT")
        return 2
    key, partitions = args.cluster_key, args.num_partitions
    if args.zookeeper:
        from waltz_client.cluster.admin import read_params
        from waltz_client.cluster.zk import close, connect

        zk = connect(args.zookeeper)
        try:
            params = read_params(zk, args.zk_root)
        finally:
            close(zk)
        key = key or params.key
        partitions = partitions or params.num_partitions
    tls, files = None, None
    if args.tls_ca or args.tls_cert:
        files = TlsFiles(args.tls_cert, args.tls_key, args.tls_ca)
        try:
            files.check("tls", listening=False)
            tls = TlsDial.of(files, args.tls_server_name or host)
        except (ValueError, OSError, ssl.SSLError) as e:
            # "setting tls_ca: ..." names the daemons' setting; here it is the flag
            flag = str(e).replace("setting tls_", "--tls-").replace(" tls_", " --tls-")
            print(f"waltz fuzz: error: {flag}")
            return 2
    target = FuzzTarget(
        args.protocol,
        partitions or 4,
        key,
        args.replay_sessions,
        tls_hello=tls.client_hello() if tls is not None else b"",
    )
    endpoint = Endpoint(args.target, host, int(port), args.pid, tls=tls)
    if args.replay is not None:
        return _replay(endpoint, target, args)
    print(
        f"fuzzing {args.target} ({args.protocol}, pid {args.pid or 'unknown'}): "
        f"{args.frames:,} frames, seed {args.seed}",
        flush=True,
    )
    stats = event_loop.run(
        fuzz_target(
            endpoint,
            target,
            seed=args.seed,
            frames=args.frames,
            concurrency=args.concurrency,
            reply_timeout=args.reply_timeout,
            progress=every_ten_probes(lambda line: print(line, flush=True)),
        )
    )
    print("\n".join(describe_stats(stats)))
    # The client check dials servers: with the --tls-* files when they are a client's.
    client_tls = files if tls is not None and args.protocol == "server" else None
    check = (
        event_loop.run(check_client(args.zookeeper, args.zk_root, tls=client_tls))
        if args.zookeeper
        else None
    )
    return _verdict([stats], check, [args.target] if stats.alive_after is False else [])


def _replay(endpoint: Endpoint, target: FuzzTarget, args: argparse.Namespace) -> int:
    plan = plan_connection(target, args.replay)
    print(
        f"connection seed {args.replay}: opening {plan.opening}, {len(plan.frames)} frames, "
        f"ending {plan.ending}"
    )
    if plan.raw:  # the ClientHello it mutates is captured afresh: the same shape, new random
        print(f"  tls {plan.tls_mutation:>8} {plan.raw[:48].hex()}{'...' * (len(plan.raw) > 48)}")
    for frame, mutation in zip(plan.frames, plan.mutations, strict=True):
        print(f"  {mutation or 'valid':>12} {frame[:48].hex()}{'...' if len(frame) > 48 else ''}")

    async def once() -> FuzzStats:
        stats = FuzzStats(
            endpoint.name,
            target.protocol,
            args.target,
            args.pid,
            args.replay,
            target.num_partitions,
        )
        await run_connection(
            endpoint.host, endpoint.port, plan, stats, args.reply_timeout, endpoint.tls
        )
        await asyncio.sleep(1.0)  # a crash takes a moment to show
        stats.alive_after = endpoint.is_alive()
        try:
            await probe(endpoint.host, endpoint.port, target, tls=endpoint.tls)
            stats.answered_after = True
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            stats.answered_after = False
        return stats

    stats = event_loop.run(once())
    print(f"after: alive {stats.alive_after}, answers {stats.answered_after}")
    return 1 if stats.failed else 0
