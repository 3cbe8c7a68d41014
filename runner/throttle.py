"""One repeat rule for every announcement: said when first due, then again only once REPEAT has passed."""

from __future__ import annotations

from collections.abc import Callable, Hashable


class Throttle:
    """When each key was last said; `due` says whether to say it now (and records that it was)."""

    def __init__(self) -> None:
        self._last: dict[Hashable, float] = {}

    def due(self, key: Hashable, now: float, repeat: float) -> bool:
        last = self._last.get(key)
        if last is not None and now - last < repeat:
            return False
        self._last[key] = now
        return True

    def forget(self, key: Hashable) -> None:
        """The condition behind KEY ended: the next time it holds it is said at once."""
        self._last.pop(key, None)

    def forget_where(self, match: Callable[[Hashable], bool]) -> None:
        for key in [k for k in self._last if match(k)]:
            self._last.pop(key)
