"""The chart's alerts (charts/waltz/templates/monitoring-prometheusrule.yaml) checked by
Prometheus' own promtool (Debian's prometheus package: ``make prometheus-deps``):

- ``promtool check rules`` on the rules the chart renders (with its defaults and with the
  values test_monitoring.py sets), and on the dashboard's queries as recording rules;
- ``promtool test rules`` on the unit tests of tests/k8s/promtool/*.yaml: hand-written
  input series, and for every alert at least one case where it fires (its labels and
  rendered annotations checked) and one where it stays quiet (a healthy series, or the
  condition held for less than its ``for:``). The rules are rendered with the chart's
  defaults into ``rules.yaml`` beside copies of those files;
- that every alert the chart renders has both kinds of case, so a new alert without
  tests fails here; and that the unit tests bite (rules without their ``for:``, or an
  alert that never fires, fail them).

Without promtool these tests skip and say so.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import shutil
import subprocess

import pytest
import yaml
from helm_binary import helm_template as chart_documents

pytestmark = pytest.mark.timeout(180)

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "waltz"
DASHBOARD = CHART / "dashboards" / "waltz.json"
UNIT_TESTS = pathlib.Path(__file__).resolve().parent / "promtool"
RULES_FILE = "rules.yaml"  # the name the unit tests' rule_files give
NAMESPACE = "waltz"
MONITORING_ON = [
    "--set",
    "cluster.enabled=true",
    "--set",
    "monitoring.podMonitor.enabled=true,monitoring.prometheusRule.enabled=true,"
    "monitoring.dashboard.enabled=true",
]
# The values tests/k8s/test_monitoring.py renders with besides the defaults.
OTHER_VALUES = [
    *MONITORING_ON,
    "--set",
    "monitoring.prometheusRule.replicaOutOfSessionFor=7m",
    "--set-json",
    "monitoring.prometheusRule.diskFullFraction=0.9",
]


def prometheus_binary(name: str) -> str | None:
    """``prometheus`` or ``promtool`` on PATH, or where Debian's package puts it."""
    found = shutil.which(name)
    if found is not None:
        return found
    path = f"/usr/bin/{name}"
    return path if os.access(path, os.X_OK) else None


def require_prometheus_binary(name: str) -> str:
    path = prometheus_binary(name)
    if path is None:
        pytest.skip(f"no {name} (Debian's prometheus package: make prometheus-deps)")
    return path


def render_chart(*args: str) -> list[dict]:
    return chart_documents(str(CHART), NAMESPACE, *args)


def chart_rule_groups(*args: str) -> list[dict]:
    """``spec.groups`` of the PrometheusRule the chart renders (defaults unless ``args``)."""
    objects = render_chart(*(args or MONITORING_ON))
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    return rule["spec"]["groups"]


def pod_monitors(*args: str) -> dict[str, dict]:
    """The chart's PodMonitors by name (defaults unless ``args``)."""
    objects = render_chart(*(args or MONITORING_ON))
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "PodMonitor"}


def alerts_of(groups: list[dict]) -> list[dict]:
    return [r for g in groups for r in g["rules"] if "alert" in r]


def write_rules(groups: list[dict], path: pathlib.Path) -> pathlib.Path:
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False, width=1000))
    return path


def run_promtool(promtool: str, *args: str, cwd: pathlib.Path | None = None) -> tuple[int, str]:
    proc = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, cwd=cwd)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_prometheus_binary("promtool")


@pytest.fixture(scope="module")
def groups() -> list[dict]:
    return chart_rule_groups()


# --- promtool check rules ---------------------------------------------------------------


def dashboard_recording_rules() -> dict:
    """The dashboard's queries (interval variables as a 1 h range would have them, the
    cluster variables as regexes) as a group of recording rules, for promtool to parse."""
    dashboard = json.loads(DASHBOARD.read_text())
    values = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
    values |= {v["name"]: ".+" for v in dashboard["templating"]["list"]}
    queries = []
    for panel in dashboard["panels"]:
        for sub in [panel, *panel.get("panels", [])]:
            for target in sub.get("targets", []):
                expr = target["expr"]
                for name in sorted(values, key=len, reverse=True):
                    expr = expr.replace("${" + name + "}", values[name])
                    expr = expr.replace("$" + name, values[name])
                assert "$" not in expr, f"a variable the dashboard does not define: {expr}"
                queries.append(expr)
    assert queries
    return {
        "name": "dashboard",
        "rules": [{"record": f"waltz:dashboard:{i}", "expr": q} for i, q in enumerate(queries)],
    }


def test_promtool_checks_the_rendered_rules_and_the_dashboard_queries(promtool, groups, tmp_path):
    for name, rendered in (("defaults", groups), ("other", chart_rule_groups(*OTHER_VALUES))):
        path = write_rules([*rendered, dashboard_recording_rules()], tmp_path / f"{name}.yaml")
        code, out = run_promtool(promtool, "check", "rules", str(path))
        assert code == 0, out
        found = len(alerts_of(rendered)) + len(dashboard_recording_rules()["rules"])
        assert f"SUCCESS: {found} rules found" in out, out
    # ... and refuses a broken expression, saying what is wrong.
    broken = copy.deepcopy(groups)
    broken[0]["rules"][0]["expr"] = "rate(waltz_operator_partition_quorum[5m]"
    code, out = run_promtool(promtool, "check", "rules", str(write_rules(broken, tmp_path / "b")))
    assert code != 0 and "unclosed left parenthesis" in out, out


# --- promtool test rules ----------------------------------------------------------------


def unit_test_files() -> list[pathlib.Path]:
    files = sorted(UNIT_TESTS.glob("*.yaml"))
    assert files, f"no promtool unit tests in {UNIT_TESTS}"
    return files


def run_unit_tests(promtool: str, groups: list[dict], where: pathlib.Path) -> tuple[int, str]:
    """The unit tests against ``groups``: the rules written as rules.yaml beside copies of
    the test files (the checkout is left alone; parallel runs do not share a file)."""
    where.mkdir(parents=True, exist_ok=True)
    names = []
    for path in unit_test_files():
        shutil.copy(path, where / path.name)
        names.append(path.name)
    write_rules(groups, where / RULES_FILE)
    return run_promtool(promtool, "test", "rules", *names, cwd=where)


def test_every_alert_passes_its_promtool_unit_tests(promtool, groups, tmp_path):
    code, out = run_unit_tests(promtool, groups, tmp_path / "rendered")
    assert code == 0, out
    assert out.count("SUCCESS") == len(unit_test_files()), out


def cases(files: list[pathlib.Path]) -> dict[str, dict[str, int]]:
    """alert name -> {"firing": n, "quiet": n}: the unit tests' alert_rule_test entries
    that expect it to fire, and those that expect it quiet."""
    out: dict[str, dict[str, int]] = {}
    for path in files:
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == [RULES_FILE], path.name
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                kind = "firing" if case.get("exp_alerts") else "quiet"
                counts = out.setdefault(case["alertname"], {"firing": 0, "quiet": 0})
                counts[kind] += 1
    return out


def check_coverage(groups: list[dict], files: list[pathlib.Path]) -> None:
    have = cases(files)
    names = [a["alert"] for a in alerts_of(groups)]
    assert len(names) == len(set(names)), names
    for name in names:
        counts = have.get(name, {"firing": 0, "quiet": 0})
        assert counts["firing"] and counts["quiet"], (
            f"{name} needs a promtool unit test in tests/k8s/promtool/ where it fires and "
            f"one where it stays quiet (it has {counts})"
        )
    unknown = sorted(set(have) - set(names))
    assert not unknown, f"unit tests of alerts the chart does not have: {unknown}"


def test_every_alert_has_a_firing_and_a_quiet_case(groups):
    check_coverage(groups, unit_test_files())


def test_a_new_alert_without_unit_tests_is_refused(groups):
    grown = copy.deepcopy(groups)
    grown[0]["rules"].append({**grown[0]["rules"][0], "alert": "WaltzSomethingNew"})
    with pytest.raises(AssertionError, match="WaltzSomethingNew needs a promtool unit test"):
        check_coverage(grown, unit_test_files())


def test_the_unit_tests_bite(promtool, groups, tmp_path):
    # Without their for: the alerts fire where the quiet cases say they must not yet.
    hasty = copy.deepcopy(groups)
    for alert in alerts_of(hasty):
        alert.pop("for")
    code, out = run_unit_tests(promtool, hasty, tmp_path / "hasty")
    assert code != 0, out
    for alert in alerts_of(groups):
        assert f"alertname: {alert['alert']}" in out, (alert["alert"], out)
    # An alert that never fires fails its firing case.
    mute = copy.deepcopy(groups)
    for alert in alerts_of(mute):
        if alert["alert"] == "WaltzPartitionQuorumLost":
            alert["expr"] = "waltz_operator_partition_quorum == 2"
    code, out = run_unit_tests(promtool, mute, tmp_path / "mute")
    assert code != 0 and "alertname: WaltzPartitionQuorumLost" in out, out
