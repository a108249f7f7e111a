"""``waltz-operator --log-format json`` (or ``$WALTZ_OPERATOR_LOG_FORMAT``): kopf's lines and
the operator's own as the daemons' JSON lines, one handler for all of them (kopf adds its
own beside the text one), with ``object`` on a line about a resource; a bad value exits 2
with one line."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest

from waltz_client.runtime.json_logs import JsonFormatter
from waltz_operator.main import (
    OperatorJsonFormatter,
    configure_operator_logging,
    log_format,
    parser,
)


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger (and asyncio's, which kopf changes), put back afterwards."""
    root, aio = logging.getLogger(), logging.getLogger("asyncio")
    saved = (list(root.handlers), root.level, list(aio.handlers), aio.propagate)
    yield root
    logging.captureWarnings(False)
    root.handlers[:], aio.handlers[:] = saved[0], saved[2]
    root.setLevel(saved[1])
    aio.propagate = saved[3]


def test_text_is_the_default_and_json_comes_from_the_flag_or_the_variable(monkeypatch):
    monkeypatch.delenv("WALTZ_OPERATOR_LOG_FORMAT", raising=False)
    assert log_format(parser().parse_args([])) == "text"
    assert log_format(parser().parse_args(["--log-format", "json"])) == "json"
    monkeypatch.setenv("WALTZ_OPERATOR_LOG_FORMAT", "json")
    assert log_format(parser().parse_args([])) == "json"
    assert log_format(parser().parse_args(["--log-format=text"])) == "text"  # the flag wins


@pytest.mark.parametrize(
    ("args", "env"), [(["--log-format", "yaml"], {}), ([], {"WALTZ_OPERATOR_LOG_FORMAT": "xml"})]
)
def test_a_bad_log_format_exits_2_with_one_line(args, env, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    proc = subprocess.run(
        [sys.executable, "-m", "waltz_operator.main", "--namespace", "x", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("waltz-operator: --log-format"), line
    assert "expected text or json" in line


def test_json_leaves_one_handler_and_every_line_is_json(root_logger):
    configure_operator_logging(verbose=False, fmt="json")
    (handler,) = root_logger.handlers  # kopf's own handler replaced, not beside ours
    assert isinstance(handler.formatter, OperatorJsonFormatter)
    assert isinstance(handler, logging.StreamHandler)
    out = io.StringIO()
    handler.setStream(out)
    logging.getLogger("kopf.activities.startup").info("starting %s", "up")
    logging.getLogger("waltz_operator.reconcile").warning(
        "storage pod %s is gone",
        "demo-storage-1",
        extra={"k8s_ref": {"kind": "WaltzCluster", "namespace": "prod", "name": "demo"}},
    )
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["logger"] == "kopf.activities.startup"
    assert first["message"] == "starting up"
    assert "object" not in first
    assert second["object"] == "prod/demo"
    assert second["message"] == "storage pod demo-storage-1 is gone"
    assert {"time", "level", "logger", "message"} <= set(second)


def test_text_is_one_handler_in_the_daemons_format(root_logger, capsys):
    """Each line once (basicConfig's handler beside kopf's printed every line twice), in
    the daemons' format, with a resource's namespace/name in front of a line about it."""
    root_logger.handlers[:] = []
    configure_operator_logging(verbose=True, fmt="text")
    assert len(root_logger.handlers) == 1
    assert not any(isinstance(h.formatter, JsonFormatter) for h in root_logger.handlers)
    assert root_logger.level == logging.DEBUG
    logging.getLogger("waltz_operator.reconcile").info("reconciled")
    lines = [line for line in capsys.readouterr().err.splitlines() if "reconciled" in line]
    assert len(lines) == 1
    assert lines[0].endswith(" INFO waltz_operator.reconcile: reconciled")
