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
    EXPIRED = "expired"  # its deadline passed before it committed: nothing of it is in the log


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

    def __init__(self, limit: int, first_backoff: float, deadline: float | None = None) -> None:
        self.limit = limit
        # On the caller's clock: past it, no attempt starts and no wait for one goes on.
        self.deadline = deadline
        self.attempts = 0
        self.first_backoff = first_backoff
        self.backoff: Backoff | None = None  # made on the first lost append (most have none)
        self._last_failure = ""  # why the latest attempt did not commit

    @classmethod
    def for_context(
        cls,
        own_limit: int | None,
        default_limit: int,
        first_backoff: float,
        now: float = 0.0,
        own_timeout: float | None = None,
        default_timeout: float | None = None,
    ) -> SubmissionRetries:
        """A context's own ``max_retries`` and ``timeout``, else the client's; the
        deadline is ``now`` plus the timeout (none without one)."""
        timeout = default_timeout if own_timeout is None else own_timeout
        return cls(
            default_limit if own_limit is None else own_limit,
            first_backoff,
            None if timeout is None else now + timeout,
        )

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def remaining(self, now: float) -> float | None:
        """Seconds left before the deadline (None: no deadline)."""
        return None if self.deadline is None else max(0.0, self.deadline - now)

    def expiry(self) -> Finish:
        """The deadline passed between attempts, or while waiting to make one."""
        why = self._last_failure or "no attempt could be made (waiting for a mount)"
        return Finish(
            SubmitResult(
                SubmitStatus.EXPIRED,
                attempts=self.attempts,
                reason=f"expired after {self.attempts} attempts: {why}",
            )
        )

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
                if resolution.remounted:
                    # In flight across a remount that has succeeded: whatever lost it (a
                    # partition moved, a connection dropped) is over, and the retry goes
                    # to the partition's owner at once. Waiting would only lengthen a
                    # hand-over's gap (a rolling restart's, by the first pause).
                    return RetryAfter(0.0)
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


def completion_hook(result: SubmitResult) -> str:
    """The context's hook a finished submission calls (the spec's): ``on_completion``
    (True: committed, False: ignored), ``on_expiration``, or ``on_exception`` (failed:
    with the error, or a ``SubmissionFailed`` naming the reason)."""
    match result.status:
        case SubmitStatus.COMMITTED | SubmitStatus.IGNORED:
            return "on_completion"
        case SubmitStatus.EXPIRED:
            return "on_expiration"
    return "on_exception"
