"""Since when each storage node has failed every probe. Pure: the clock is passed in."""

from __future__ import annotations

from collections.abc import Iterable


class UnreachableSince:
    """A node counts as unreachable from its first failed probe after a successful one (or
    after tracking began) until a probe succeeds."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}
        self._known: set[str] = set()

    def observe(self, address: str, reachable: bool, now: float) -> None:
        self._known.add(address)
        if reachable:
            self._since.pop(address, None)
        else:
            self._since.setdefault(address, now)

    def keep_only(self, addresses: Iterable[str]) -> None:
        """Forget nodes that left the assignment."""
        keep = set(addresses)
        self._known &= keep
        self._since = {a: t for a, t in self._since.items() if a in keep}

    def clear(self) -> None:
        """Forget everything (this server is no longer the one that watches)."""
        self._since.clear()
        self._known.clear()

    def seconds(self, address: str, now: float) -> float:
        """How long ``address`` has been unreachable (0 when reachable or never probed)."""
        since = self._since.get(address)
        return 0.0 if since is None else max(0.0, now - since)

    def unreachable(self) -> set[str]:
        return set(self._since)

    def reachable(self) -> set[str]:
        """Nodes whose last probe succeeded."""
        return self._known - set(self._since)

    def due(self, after: float, now: float) -> list[str]:
        """Nodes unreachable for at least ``after`` seconds."""
        return sorted(a for a, t in self._since.items() if now - t >= after)

    def tracked(self) -> set[str]:
        return set(self._known)
