"""What the client raises: requests the cluster could not answer, refusals, missing
transactions. Pure, so the partition core can name a refused mount without the shell."""

from __future__ import annotations

import re

from .wire.client_messages import ErrorResponse


class WaltzError(Exception):
    """A request the cluster could not answer in time, or a client that is closed."""


class SubmissionFailed(WaltzError):
    """What a failed submission's ``on_exception`` gets when no error of its own caused
    it (retries exhausted, refused by the server, cancelled, the client closed): the
    result's reason."""


class Forbidden(WaltzError):
    """The cluster's access policy does not let this client's certificate identity do
    that on the partition (the server's FORBIDDEN)."""


class Unauthorized(Forbidden):
    """This client's certificate identity may not have a client ID (its quota is used up:
    LIMIT_EXCEEDED), or may not act as the one it has (UNAUTHORIZED: it was released
    after going unused for the server's client_id_retention)."""


class MissingTransactions(WaltzError):
    """A range read found its first transactions gone (below the partition's retention
    mark): ``first_available`` is where the log now starts."""

    def __init__(self, partition_id: int, requested: int, first_available: int) -> None:
        super().__init__(
            f"partition {partition_id}: transactions {requested}..{first_available - 1} are "
            f"no longer in the log; the first available is {first_available}"
        )
        self.partition_id = partition_id
        self.requested = requested
        self.first_available = first_available


_FIRST_AVAILABLE = re.compile(r"first available is (\d+)")


def truncated(partition_id: int, requested: int, answer: ErrorResponse) -> MissingTransactions:
    """The server's TRUNCATED answer as an exception (its message names the log start)."""
    m = _FIRST_AVAILABLE.search(answer.message)
    return MissingTransactions(partition_id, requested, int(m.group(1)) if m else requested + 1)
