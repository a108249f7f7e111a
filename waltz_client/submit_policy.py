"""What becomes of a submission after each attempt: done (and how it ended), or executed
again, after a pause or once a lock's transaction is applied. Pure: the pauses are
returned, not slept, so the client's shell and the simulator carry them out on their
own clocks."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from .errors import MissingTransactions, WaltzError
from .monitor import Outcome, Resolution


class SubmitStatus(Enum):
    COMMITTED = "committed"
    IGNORED = "ignored"  # execute() returned False
    FAILED = "failed"  # gave up: retries exhausted, execute() raised, or the client closed


@dataclass(frozen=True)
class SubmitResult:
    status: SubmitStatus
    transaction_id: int = -1
    attempts: int = 0
    reason: str = ""

    @property
    def committed(self) -> bool:
        return self.status == SubmitStatus.COMMITTED


# A pause between retries never grows beyond this.
MAX_BACKOFF = 2.0


class Backoff:
    """Pauses between retries: ``first`` seconds, doubling up to ``MAX_BACKOFF``."""

    def __init__(self, first: float) -> None:
        self.first = first
        self.current = first

    def grow(self) -> float:
        """The pause to take now; the next one is twice as long (up to the cap)."""
        pause = self.current
        self.current = min(MAX_BACKOFF, self.current * 2)
        return pause

    def reset(self) -> None:
        self.current = self.first


# The steps are not frozen: a frozen dataclass costs three times as much to build, and
# every submission builds one.
@dataclass(slots=True)
class Finish:
    """The submission ends with ``result``; ``error`` first goes to the context's
    ``on_exception`` hook."""

    result: SubmitResult
    error: BaseException | None = None


@dataclass(slots=True)
class RetryAfter:
    """The append was lost: execute the context again after ``pause`` seconds."""

    pause: float


@dataclass(slots=True)
class RetryWhenApplied:
    """A lock failure: the context's ``on_lock_failure`` hears of ``transaction_id``, and
    it runs again once the client has applied that transaction (no backoff: the newer
    state is what it needs)."""

    transaction_id: int


Step = Finish | RetryAfter | RetryWhenApplied


class SubmissionRetries:
    """One submission's attempts: how many ran, whether another may, what follows each."""

    def __init__(self, limit: int, first_backoff: float) -> None:
        self.limit = limit
        self.attempts = 0
        self.first_backoff = first_backoff
        self.backoff: Backoff | None = None  # made on the first lost append (most have none)
        self._last_failure = ""  # why the latest attempt did not commit

    @classmethod
    def for_context(
        cls, own_limit: int | None, default_limit: int, first_backoff: float
    ) -> SubmissionRetries:
        """A context's own ``max_retries``, else the client's."""
        return cls(default_limit if own_limit is None else own_limit, first_backoff)

    def may_attempt(self, closed: bool) -> bool:
        return self.attempts < self.limit and not closed

    def begin_attempt(self) -> None:
        self.attempts += 1

    def after(self, resolution: Resolution[Any] | None) -> Step:
        """The next step once the attempt's append is settled (None: ``execute`` gave
        up, so nothing was appended)."""
        if resolution is None:
            return Finish(SubmitResult(SubmitStatus.IGNORED, attempts=self.attempts))
        match resolution.outcome:
            case Outcome.COMMITTED:
                return Finish(
                    SubmitResult(SubmitStatus.COMMITTED, resolution.transaction_id, self.attempts)
                )
            case Outcome.REFUSED:
                return Finish(
                    self.failed(f"the server refused it: {resolution.reason}"),
                )
            case Outcome.LOCK_FAILED:
                self._last_failure = f"lock failure against transaction {resolution.transaction_id}"
                return RetryWhenApplied(resolution.transaction_id)
            case Outcome.LOST:
                self._last_failure = "the append was lost (server or connection failure)"
                if self.backoff is None:
                    self.backoff = Backoff(self.first_backoff)
                return RetryAfter(self.backoff.grow())
        raise AssertionError(f"unknown outcome {resolution.outcome}")

    def mount_refused(self, error: WaltzError) -> Finish:
        """The partition's mount is refused (the access policy, or the application's
        high-water mark below the log start): waiting would not help."""
        if isinstance(error, MissingTransactions):
            return Finish(self.failed(f"mount refused: {error!r}"), error)
        return Finish(self.failed(str(error)))

    def step_failed(self, step: str, error: Exception) -> Finish:
        """The application's code (``step`` names it) raised ``error``."""
        return Finish(self.failed(f"{step} raised {error!r}"), error)

    def gave_up(self) -> SubmitResult:
        """No attempt is left (or the client closed)."""
        return self.failed(f"gave up after {self.attempts} attempts: {self._last_failure}")

    def failed(self, reason: str) -> SubmitResult:
        return SubmitResult(SubmitStatus.FAILED, attempts=self.attempts, reason=reason)
