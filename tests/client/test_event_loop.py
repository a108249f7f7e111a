"""The event loop waltz's processes and commands run on (waltz_client/runtime/event_loop.py):
uvloop unless WALTZ_EVENT_LOOP says asyncio, and a bad value refused before anything
starts."""

from __future__ import annotations

import asyncio
import types
import warnings

import pytest
import uvloop

from waltz_client.runtime import event_loop
from waltz_client.runtime.daemon import run_daemon
from waltz_client.tools import cli


async def _loop_kind() -> str:
    return "uvloop" if isinstance(asyncio.get_running_loop(), uvloop.Loop) else "asyncio"


def test_the_choice_is_uvloop_unless_the_variable_says_asyncio() -> None:
    assert event_loop.chosen({}) == "uvloop"
    assert event_loop.chosen({"WALTZ_EVENT_LOOP": ""}) == "uvloop"
    assert event_loop.chosen({"WALTZ_EVENT_LOOP": " AsyncIO "}) == "asyncio"
    assert event_loop.chosen({"WALTZ_EVENT_LOOP": "uvloop"}) == "uvloop"


def test_describe_names_the_loop_a_process_runs_on() -> None:
    assert event_loop.describe({}) == "uvloop"
    assert event_loop.describe({"WALTZ_EVENT_LOOP": "asyncio"}) == "asyncio"


def test_a_bad_choice_names_the_variable_and_what_it_takes() -> None:
    with pytest.raises(event_loop.EventLoopChoiceError) as e:
        event_loop.chosen({"WALTZ_EVENT_LOOP": "tokio"})
    assert str(e.value) == "WALTZ_EVENT_LOOP='tokio': expected one of uvloop, asyncio"


def test_run_uses_the_chosen_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WALTZ_EVENT_LOOP", raising=False)
    assert event_loop.run(_loop_kind()) == "uvloop"
    monkeypatch.setenv("WALTZ_EVENT_LOOP", "asyncio")
    assert event_loop.run(_loop_kind()) == "asyncio"


def test_new_event_loop_is_of_the_chosen_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WALTZ_EVENT_LOOP", raising=False)
    loop = event_loop.new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    monkeypatch.setenv("WALTZ_EVENT_LOOP", "asyncio")
    loop = event_loop.new_event_loop()
    try:
        assert not isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_run_refuses_a_bad_choice_without_starting_the_coroutine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WALTZ_EVENT_LOOP", "tokio")
    started = []

    async def work() -> None:
        started.append(True)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "coroutine was never awaited"
        with pytest.raises(event_loop.EventLoopChoiceError):
            event_loop.run(work())
    assert started == []


def test_the_waltz_command_refuses_a_bad_choice_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WALTZ_EVENT_LOOP", "tokio")
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--floor"])  # refused before the floor's processes start
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "waltz: error: WALTZ_EVENT_LOOP='tokio': expected one of uvloop, asyncio\n"
    )


def _daemon(serve) -> None:
    run_daemon(
        "waltz-test",
        lambda: types.SimpleNamespace(log_level="WARNING"),
        serve,
        ValueError,
    )


def test_a_daemon_serves_on_the_chosen_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    async def serve(config) -> int:
        seen.append(await _loop_kind())
        return 3

    for choice in ("", "asyncio"):
        monkeypatch.setenv("WALTZ_EVENT_LOOP", choice)
        with pytest.raises(SystemExit) as e:
            _daemon(serve)
        assert e.value.code == 3  # its status is the process's
    assert seen == ["uvloop", "asyncio"]


def test_a_daemon_refuses_a_bad_choice_before_serving(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WALTZ_EVENT_LOOP", "tokio")
    calls = []

    def serve(config):
        calls.append(config)
        raise AssertionError("must not be called")

    with pytest.raises(SystemExit) as e:
        _daemon(serve)
    assert e.value.code == 2
    assert calls == []
    assert capsys.readouterr().err == (
        "waltz-test: error: WALTZ_EVENT_LOOP='tokio': expected one of uvloop, asyncio\n"
    )
