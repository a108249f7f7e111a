"""The daemons' JSON log lines (``waltz_client.runtime.json_logs``): one object a line with
the record's time, level, logger, message and traceback, and the partition, session and
peer that the context (not the log call) carries, into tasks as well; the text format as
it always was."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from waltz_client.runtime.json_logs import (
    JsonFormatter,
    configure_logging,
    current_context,
    formatter,
    log_context,
    rfc3339,
    set_log_context,
)

RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger of its own writing JSON lines into a buffer."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("waltz_test.json_logs")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    yield logger, out
    logger.handlers.clear()
    logger.propagate = True


def lines(out: io.StringIO) -> list[dict]:
    text = out.getvalue()
    assert text.endswith("\n")
    parsed = [json.loads(line) for line in text.splitlines()]
    assert all(isinstance(p, dict) for p in parsed)
    return parsed


def test_a_line_has_time_level_logger_and_the_formatted_message(captured) -> None:
    logger, out = captured
    logger.warning("partition %d: %s", 3, "stalled")
    (line,) = lines(out)
    assert set(line) == {"time", "level", "logger", "message"}
    assert line["level"] == "WARNING"
    assert line["logger"] == "waltz_test.json_logs"
    assert line["message"] == "partition 3: stalled"
    assert RFC3339_MS.match(line["time"]), line["time"]


def test_the_time_is_utc_with_milliseconds() -> None:
    assert rfc3339(0.0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1_700_000_000.1239) == "2023-11-14T22:13:20.123Z"
    assert rfc3339(1_700_000_000.9999) == "2023-11-14T22:13:20.999Z"  # never rounds to 1000


def test_a_multi_line_message_and_a_traceback_stay_on_one_line(captured) -> None:
    logger, out = captured
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        logger.exception("first line\nsecond line")
    assert len(out.getvalue().splitlines()) == 1
    (line,) = lines(out)
    assert line["message"] == "first line\nsecond line"
    assert line["level"] == "ERROR"
    assert line["exception"].startswith("Traceback (most recent call last):")
    assert line["exception"].endswith("ValueError: bad\nthing")


def test_odd_arguments_are_formatted_not_refused(captured) -> None:
    logger, out = captured
    logger.info("%s and %r", object.__new__(object), b"\xff\x00")
    logger.info({"a": 1})  # a non-string message, as logging allows
    first, second = lines(out)
    assert first["message"].endswith("and b'\\xff\\x00'")
    assert second["message"] == "{'a': 1}"


def test_the_context_fields_come_from_the_context(captured) -> None:
    logger, out = captured
    logger.info("outside")
    with log_context(partition=2, session=7, peer="10.0.0.7:51234"):
        logger.info("inside")
        with log_context(peer="10.0.0.8:4000"):
            logger.info("nested")
        logger.info("inside again")
    logger.info("outside again")
    outside, inside, nested, again, after = lines(out)
    assert "partition" not in outside and "peer" not in outside and "session" not in outside
    assert (inside["partition"], inside["session"], inside["peer"]) == (2, 7, "10.0.0.7:51234")
    assert (nested["partition"], nested["session"], nested["peer"]) == (2, 7, "10.0.0.8:4000")
    assert again["peer"] == "10.0.0.7:51234"
    assert set(after) == {"time", "level", "logger", "message"}
    assert current_context() == {}


def test_a_field_given_to_the_call_wins(captured) -> None:
    logger, out = captured
    with log_context(partition=2):
        logger.info("about another partition", extra={"partition": 5})
    (line,) = lines(out)
    assert line["partition"] == 5


def test_the_context_is_put_back_after_an_exception() -> None:
    with pytest.raises(RuntimeError), log_context(partition=1, peer="a:1"):
        raise RuntimeError
    assert current_context() == {}


def test_tasks_carry_the_context_they_were_created_in(captured) -> None:
    """A partition's tasks are created inside ``log_context``; a task that learns its
    session sets it in its own context, which its own tasks then carry, and nobody
    else sees."""
    logger, out = captured

    async def session_loop() -> None:
        set_log_context(session=9)
        logger.info("recovered")
        await asyncio.get_running_loop().create_task(writer())

    async def writer() -> None:
        logger.info("writing")

    async def append_loop() -> None:
        await asyncio.sleep(0)
        logger.info("appending")

    async def main() -> None:
        with log_context(partition=4):
            tasks = [asyncio.create_task(session_loop()), asyncio.create_task(append_loop())]
        logger.info("the server's own line")
        await asyncio.gather(*tasks)

    loop = asyncio.new_event_loop()  # not asyncio.run: it would unset the current loop
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    by_message = {line["message"]: line for line in lines(out)}
    assert "partition" not in by_message["the server's own line"]
    assert (by_message["recovered"]["partition"], by_message["recovered"]["session"]) == (4, 9)
    assert (by_message["writing"]["partition"], by_message["writing"]["session"]) == (4, 9)
    assert by_message["appending"]["partition"] == 4
    assert "session" not in by_message["appending"]


def test_text_is_the_format_the_daemons_always_wrote() -> None:
    record = logging.LogRecord("waltz_server", logging.INFO, __file__, 1, "hello %s", ("x",), None)
    text = formatter("text").format(record)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO waltz_server: hello x", text)
    with log_context(partition=1):
        assert "partition" not in formatter("text").format(record)
    with pytest.raises(ValueError, match="expected one of text, json, got 'xml'"):
        formatter("xml")


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, its handlers and level put back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    root.handlers[:] = []
    yield root
    logging.captureWarnings(False)
    root.handlers[:] = handlers
    root.setLevel(level)


def test_configure_json_leaves_one_json_handler(root_logger) -> None:
    root_logger.addHandler(logging.StreamHandler(io.StringIO()))  # someone else's, text
    configure_logging("DEBUG", "json")
    (handler,) = root_logger.handlers
    assert isinstance(handler.formatter, JsonFormatter)
    assert root_logger.level == logging.DEBUG


def test_configure_text_is_basic_config(root_logger) -> None:
    root_logger.handlers[:] = []  # pytest's capture handlers too: basicConfig wants none
    configure_logging("WARNING", "text")
    (handler,) = root_logger.handlers
    assert handler.formatter is not None
    assert handler.formatter._fmt == "%(asctime)s %(levelname)s %(name)s: %(message)s"
    assert root_logger.level == logging.WARNING
