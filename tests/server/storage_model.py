"""One replica's storage as the recovery models see it: its log (a value per
transaction ID) and the control state a store session sets. Shared by the recovery
model (test_recovery_plan.py) and the replica-change model (test_replica_change_model.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from waltz_client.cluster.metadata import NO_SESSION
from waltz_server.recovery import StorageView


@dataclass
class Storage:
    """One replica's storage: its log (a value per transaction ID) and control state."""

    log: list[tuple[int, int]] = field(default_factory=list)
    last_session_id: int = NO_SESSION
    low_water_mark: int = -1
    local_low_water_mark: int = -1

    @property
    def top(self) -> int:
        return len(self.log) - 1

    def view(self) -> StorageView:
        return StorageView(
            self.last_session_id, self.low_water_mark, self.local_low_water_mark, self.top
        )

    def truncate(self, txid: int) -> None:
        # The storage refuses to drop what its local low-water mark vouches for.
        assert txid >= self.local_low_water_mark, (
            f"truncating to {txid} below the local low-water mark {self.local_low_water_mark}"
        )
        del self.log[txid + 1 :]

    def set_low_water_mark(self, session_id: int, mark: int) -> None:
        self.last_session_id = session_id
        self.low_water_mark = mark
        self.local_low_water_mark = min(mark, self.top)
