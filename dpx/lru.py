"""The one cache policy of dpx: the planner's schedule templates and every cache of a
communicator hold at most ``limit`` entries, least recently used first out. A hit
refreshes its entry, so a hot entry survives any stream of one-off entries.

The keys of the hot caches (a prepared op's call key: a tuple of a dozen fields) spend
most of a lookup on their hash, which is not kept between lookups; so the recency order
is kept apart, by a small int per entry: a hit costs one lookup by key and one
``move_to_end`` of an int, not a second hash of the key.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterator

from dpx.errors import check_int

__all__ = ["LRU"]


class LRU:
    """``key -> value``, at most ``limit`` entries, least recently used first out."""

    __slots__ = ("limit", "_map", "_order", "_tick")

    def __init__(self, limit: int) -> None:
        self.limit = check_int("a cache's limit", limit, minimum=0)
        #: key -> [value, tag]; tag -> key, least recently used first
        self._map: dict[Any, list] = {}
        self._order: OrderedDict[int, Any] = OrderedDict()
        self._tick = 0

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, key: Any) -> bool:
        return key in self._map

    def __iter__(self) -> Iterator[Any]:
        """The keys, least recently used first."""
        return iter(list(self._order.values()))

    def values(self) -> list:
        return [e[0] for e in self._map.values()]

    def hit(self, key: Any) -> Any:
        """The value under ``key`` (refreshed: now the most recently used), or None."""
        e = self._map.get(key)
        if e is None:
            return None
        self._order.move_to_end(e[1])
        return e[0]

    def lookups(self) -> tuple[Any, Any]:
        """``(get, touch)`` for a hot path that inlines :meth:`hit`: ``e = get(key)`` is
        ``None`` or ``[value, tag]``, and ``touch(e[1])`` refreshes the entry (bound once;
        valid for the cache's life)."""
        return self._map.get, self._order.move_to_end

    def put(self, key: Any, value: Any) -> Any:
        """Keep ``value`` under ``key`` as the most recently used entry, evicting the least
        recently used one past the limit; returns ``value``."""
        self._tick += 1
        e = self._map.setdefault(key, [value, self._tick])   # one hash of the key
        if e[1] != self._tick:   # it was there
            e[0] = value
            self._order.move_to_end(e[1])
            return value
        self._order[self._tick] = key
        while len(self._map) > self.limit:
            _, old = self._order.popitem(last=False)
            del self._map[old]
        return value

    def clear(self) -> None:
        self._map.clear()
        self._order.clear()
