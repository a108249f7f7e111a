"""A pipeline: named steps run in their declared order over one state.

Each step takes the state and returns the next one, or a ``Stop`` that ends the
pipeline (the steps after it do not run). A step runs only when its guard, a pure
predicate over the state, says so; a step may be a plain function (a decision) or a
coroutine (a call to the outside world). The runner itself decides nothing: which step
runs, and what it does, is all in the steps and their guards.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

State = TypeVar("State")


@dataclass(frozen=True)
class Stop:
    """The pipeline cannot go on: why (a short CamelCase reason) and what to tell."""

    reason: str
    message: str


def always(_state: object) -> bool:
    return True


@dataclass(frozen=True)
class Step(Generic[State]):
    name: str
    run: Callable[[State], State | Stop | Awaitable[State | Stop]]
    when: Callable[[State], bool] = always


@dataclass(frozen=True)
class Finished(Generic[State]):
    state: State  # as the last step that ran left it
    ran: tuple[str, ...]  # the names of the steps that ran, in order
    stop: Stop | None = None  # set when a step stopped the pipeline (the last in ``ran``)


async def run_pipeline(steps: Sequence[Step[State]], state: State) -> Finished[State]:
    ran: list[str] = []
    for step in steps:
        if not step.when(state):
            continue
        ran.append(step.name)
        result = step.run(state)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, Stop):
            return Finished(state, tuple(ran), result)
        state = result
    return Finished(state, tuple(ran))
