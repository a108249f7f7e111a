"""``waltz-operator``: run the WaltzCluster operator (kopf, in this process).

    waltz-operator --namespace waltz            # one namespace (repeatable)
    waltz-operator --all-namespaces
    waltz-operator --kubeconfig ~/.kube/config --context kind-waltz --namespace default

Credentials: the pod's service account inside a cluster, else the kubeconfig. Without
``--namespace`` or ``--all-namespaces`` it watches ``$WALTZ_WATCH_NAMESPACE`` (comma
separated), else its own pod's namespace. Bad arguments exit 2 with one line.

With ``--leader-lease NAME`` (or ``$WALTZ_LEADER_LEASE``; the chart sets it) several
replicas run and the one holding that Lease reconciles (leader.py); the others serve
/healthz and wait. A leader that loses the Lease exits 1 at once, and its pod restarts
as a candidate.

With ``--system-pki PREFIX`` (the chart sets it) every replica keeps the chart's own CA
and certificates in Secrets ``PREFIX-*`` of its namespace (system_pki.py): one for the
bundled ZooKeeper named by ``--zookeeper-tls``, and one for its own HTTPS port
(``--metrics-tls``, named for ``--operator-service``), at start-up and every hour.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import sys
from typing import Any

import kopf

from waltz_client.runtime.json_logs import (
    JSON,
    LOG_FORMATS,
    TEXT,
    JsonFormatter,
    configure_logging,
)

from .handlers import OperatorConfig, register, serve_http
from .kube import KubeApi, connection_from_environment
from .leader import LeaderElector
from .system_pki import SystemNames
from .system_tls import SystemTls

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"not a port (0-65535): {text!r}")
    return int(text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="waltz-operator", description="Reconcile WaltzCluster resources."
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], help="watch it")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch them all")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, $KUBECONFIG)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--metrics-host", default="0.0.0.0", help="address of /metrics, /healthz")
    p.add_argument("--metrics-port", type=_port, default=8080, help="0: any free port")
    p.add_argument(
        "--reconcile-interval", type=_positive, default=10.0, help="seconds between looks"
    )
    p.add_argument(
        "--delete-timeout",
        type=_positive,
        default=300.0,
        help="seconds a deletion may take before the finalizer goes anyway",
    )
    p.add_argument(
        "--leader-lease",
        default=os.environ.get("WALTZ_LEADER_LEASE") or None,
        help="Lease to hold while reconciling (default $WALTZ_LEADER_LEASE; none: no election)",
    )
    p.add_argument(
        "--leader-namespace",
        default=os.environ.get("POD_NAMESPACE") or None,
        help="namespace of the Lease (default $POD_NAMESPACE, else the pod's namespace)",
    )
    p.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME") or socket.gethostname(),
        help="this replica's name as the Lease's holder (default $POD_NAME)",
    )
    p.add_argument(
        "--system-pki",
        metavar="PREFIX",
        default=os.environ.get("WALTZ_SYSTEM_PKI") or None,
        help="keep the chart's CA and certificates in Secrets PREFIX-* of the operator's "
        "namespace (default $WALTZ_SYSTEM_PKI; none: no system PKI)",
    )
    p.add_argument(
        "--zookeeper-tls",
        metavar="NAME",
        default="",
        help="issue a server certificate for the bundled ZooKeeper NAME (its Services NAME "
        "and NAME-headless); needs --system-pki",
    )
    p.add_argument(
        "--operator-service",
        metavar="NAME",
        default="",
        help="the operator's Service, named in its HTTPS certificate; needs --system-pki",
    )
    p.add_argument(
        "--metrics-tls",
        action="store_true",
        help="serve /metrics and /healthz over HTTPS with the system PKI's certificate",
    )
    p.add_argument(
        "--log-format",
        default=os.environ.get("WALTZ_OPERATOR_LOG_FORMAT") or TEXT,
        help="text, or json: one object a line (time, level, logger, message, exception) "
        "(default $WALTZ_OPERATOR_LOG_FORMAT, else text)",
    )
    p.add_argument("--verbose", "-v", action="store_true")
    return p


def log_format(args: argparse.Namespace) -> str:
    """The --log-format asked for (the flag, else the variable); SystemExit if neither
    text nor json."""
    value = str(args.log_format).strip().lower()
    if value not in LOG_FORMATS:
        raise SystemExit(
            f"waltz-operator: --log-format (or $WALTZ_OPERATOR_LOG_FORMAT): expected text or "
            f"json, got {args.log_format!r}"
        )
    return value


class OperatorJsonFormatter(JsonFormatter):
    """The daemons' JSON lines, and ``object`` (``namespace/name``) on the lines kopf
    logs about a resource (its text lines say ``[namespace/name]``)."""

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        line = super().fields(record)
        ref = record.__dict__.get("k8s_ref")
        if isinstance(ref, dict) and ref.get("name"):
            namespace = ref.get("namespace")
            line["object"] = f"{namespace}/{ref['name']}" if namespace else ref["name"]
        return line


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_operator_logging(verbose: bool, fmt: str) -> None:
    """Text: kopf's handler alone, in the daemons' format. JSON: kopf configured, then
    one handler writing JSON lines in its place, so that every line is JSON."""
    level = logging.DEBUG if verbose else logging.INFO
    if fmt == JSON:
        kopf.configure(verbose=verbose)
        configure_logging(level, JSON, OperatorJsonFormatter())
        return
    # One handler, kopf's, in the daemons' text format, with the resource's namespace/name
    # in front of a line about one. (basicConfig's handler beside kopf's printed every
    # line twice.)
    kopf.configure(verbose=verbose, log_format=TEXT_FORMAT, log_prefix=True)


def system_names(args: argparse.Namespace, scope: list[str] | None) -> SystemNames | None:
    """The system PKI the arguments ask for (None: none); SystemExit says what is wrong."""
    if not args.system_pki:
        if args.zookeeper_tls or args.operator_service or args.metrics_tls:
            raise SystemExit(
                "waltz-operator: --zookeeper-tls, --operator-service and --metrics-tls need "
                "--system-pki PREFIX (where the certificates are kept)"
            )
        return None
    if args.metrics_tls and not args.operator_service:
        raise SystemExit(
            "waltz-operator: --metrics-tls needs --operator-service NAME (the name its "
            "certificate is issued for)"
        )
    try:
        return SystemNames(
            args.system_pki,
            lease_namespace(args, scope),
            operator_service=args.operator_service,
            zookeeper=args.zookeeper_tls,
        )
    except ValueError as e:
        raise SystemExit(f"waltz-operator: {e}") from None


def lease_namespace(args: argparse.Namespace, scope: list[str] | None) -> str:
    if args.leader_namespace:
        return args.leader_namespace
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as f:
            return f.read().strip()
    except OSError:
        if scope:
            return scope[0]
        raise SystemExit(
            "waltz-operator: say where the Lease lives: --leader-namespace NS"
        ) from None


async def run(
    config: OperatorConfig,
    registry: kopf.OperatorRegistry,
    scope: list[str] | None,
    election: tuple[str, str, str] | None,
    system: SystemNames | None = None,
    metrics_tls: bool = False,
) -> int:
    """kopf, after winning the Lease if ``election`` (namespace, name, identity) is set;
    the system PKI kept first if ``system`` is set (its certificate serves HTTPS)."""
    if system is None:
        return await _run(config, registry, scope, election)
    kube = KubeApi(config.connection)
    keeper = SystemTls(kube, system, config.reconcile.secret_dir)
    try:
        await keeper.start()
        if metrics_tls:
            config.metrics_ssl = keeper.listening_context()
        return await _run(config, registry, scope, election)
    finally:
        await keeper.close()
        await kube.close()


async def _run(
    config: OperatorConfig,
    registry: kopf.OperatorRegistry,
    scope: list[str] | None,
    election: tuple[str, str, str] | None,
) -> int:
    """kopf, after winning the Lease if ``election`` (namespace, name, identity) is set."""

    def operator() -> Any:
        return kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=scope is None,
            namespaces=scope or (),
        )

    if election is None:
        config.metrics.leader.set(1)
        await operator()
        return 0
    kube = KubeApi(config.connection)
    elector = LeaderElector(kube, *election)
    config.metrics.progress.role = "standby"
    await serve_http(config)  # liveness while standing by
    try:
        log.info("standing by for the lease %s/%s as %s", *election)
        await elector.acquire()
        config.metrics.progress.role = "leader"
        config.metrics.leader.set(1)
        reconciling = asyncio.create_task(operator())
        holding = asyncio.create_task(elector.hold())
        done, _ = await asyncio.wait({reconciling, holding}, return_when="FIRST_COMPLETED")
        if holding in done:
            # Lost it: another replica may lead within seconds. Exit now, as client-go's
            # controllers do, rather than wait for a reconcile under way to finish: every
            # change it makes in ZooKeeper is a compare-and-set, so stopping mid-way is
            # safe, and two reconcilers at once is not.
            log.error("%s; exiting", holding.exception())
            logging.shutdown()
            os._exit(1)
        holding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await holding
        reconciling.result()
        return 0
    finally:
        await elector.release()
        await kube.close()


def namespaces(args: argparse.Namespace) -> list[str] | None:
    """The namespaces to watch; None: all of them."""
    if args.all_namespaces:
        return None
    if args.namespace:
        return args.namespace
    env = [n.strip() for n in os.environ.get("WALTZ_WATCH_NAMESPACE", "").split(",") if n.strip()]
    if env:
        return env
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as f:
            return [f.read().strip()]
    except OSError:
        raise SystemExit(
            "waltz-operator: say which namespaces to watch: --namespace NS or --all-namespaces"
        ) from None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        fmt = log_format(args)
        scope = namespaces(args)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    try:
        connection = connection_from_environment(args.kubeconfig, args.context)
    except Exception as e:  # the loaders raise several kinds; all mean the same here
        print(f"waltz-operator: no Kubernetes credentials: {e}", file=sys.stderr)
        return 2
    configure_operator_logging(args.verbose, fmt)
    try:
        system = system_names(args, scope)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    config = OperatorConfig(
        connection=connection,
        reconcile_interval=args.reconcile_interval,
        delete_timeout=args.delete_timeout,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
    )
    election = None
    if args.leader_lease:
        try:
            election = (lease_namespace(args, scope), args.leader_lease, args.identity)
        except SystemExit as e:
            print(e, file=sys.stderr)
            return 2
    registry = kopf.OperatorRegistry()
    register(registry, config)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(run(config, registry, scope, election, system, args.metrics_tls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
