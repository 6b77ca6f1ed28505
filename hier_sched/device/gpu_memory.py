"""The memory ledger of an emulated GPU: one address space, a free list, segments per process.

Device memory is modelled as a line of KiB (integers, so freed holes merge exactly). A process
holds contiguous segments; freeing a process returns its segments as holes that stay between
other processes' segments. Placement is best-fit (the smallest hole that fits, lowest address on
ties), as a caching allocator places blocks -- so "free" memory can exist only in pieces too small
for a request, which is how a job OOMs on a GPU that reports enough free memory (thesis Ch. 6.2.3).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

__all__ = ["MemoryLedger", "Segment"]

Segment = tuple[str, int, int]  # (owner, start KiB, size KiB)


class MemoryLedger:
    """Segments of device memory owned by processes, and the holes between them."""

    __slots__ = ("_total", "_hole_starts", "_hole_sizes", "_owned", "_owned_kib", "_used", "_largest_hole")

    def __init__(self, total_kib: int):
        if total_kib <= 0:
            raise ValueError(f"device memory must be positive, got {total_kib} KiB")
        self._total = total_kib
        self._hole_starts: list[int] = [0]  # sorted; parallel to _hole_sizes
        self._hole_sizes: list[int] = [total_kib]
        self._owned: dict[str, list[tuple[int, int]]] = {}  # owner -> [(start, size)] in allocation order
        self._owned_kib: dict[str, int] = {}  # owner -> sum of its sizes (asked on every allocation)
        self._used = 0
        self._largest_hole: int | None = total_kib  # None = recompute on demand

    @property
    def total_kib(self) -> int:
        return self._total

    @property
    def used_kib(self) -> int:
        return self._used

    @property
    def free_kib(self) -> int:
        return self._total - self._used

    @property
    def largest_free_kib(self) -> int:
        if self._largest_hole is None:
            self._largest_hole = max(self._hole_sizes, default=0)
        return self._largest_hole

    def owned_kib(self, owner: str) -> int:
        return self._owned_kib.get(owner, 0)

    def reserve(self, owner: str, size_kib: int) -> int | None:
        """Place a contiguous segment for ``owner``; its start, or None when no hole is big enough."""
        if size_kib <= 0:
            raise ValueError(f"segment size must be positive, got {size_kib} KiB")
        best, best_size = -1, self._total + 1  # the smallest hole that fits, the first of equals
        for position, hole in enumerate(self._hole_sizes):
            if size_kib <= hole < best_size:
                best, best_size = position, hole
        if best < 0:
            return None
        start = self._hole_starts[best]
        if self._hole_sizes[best] == size_kib:
            del self._hole_starts[best]
            del self._hole_sizes[best]
        else:
            self._hole_starts[best] += size_kib
            self._hole_sizes[best] -= size_kib
        self._owned.setdefault(owner, []).append((start, size_kib))
        self._owned_kib[owner] = self._owned_kib.get(owner, 0) + size_kib
        self._used += size_kib
        self._largest_hole = None
        return start

    def release_owner(self, owner: str) -> int:
        """Free every segment of ``owner`` (process exit); the KiB freed (0 for an unknown owner)."""
        segments = self._owned.pop(owner, [])
        for start, size in segments:
            self._free_range(start, size)
        freed = self._owned_kib.pop(owner, 0)
        self._used -= freed
        if freed:
            self._largest_hole = None
        return freed

    def segments(self) -> list[Segment]:
        """Every segment, grouped by owner in first-allocation order, each owner's in allocation order."""
        return [(owner, start, size) for owner, spans in self._owned.items() for start, size in spans]

    @classmethod
    def from_segments(cls, total_kib: int, segments: Iterable[Segment]) -> MemoryLedger:
        """Rebuild a ledger (holes included) from its segments; rejects overlaps and out-of-range."""
        ledger = cls(total_kib)
        spans = []
        for owner, start, size in segments:
            if size <= 0 or start < 0 or start + size > total_kib:
                raise ValueError(f"segment of {owner!r} at {start} KiB (+{size}) lies outside 0..{total_kib} KiB")
            ledger._owned.setdefault(owner, []).append((start, size))
            ledger._owned_kib[owner] = ledger._owned_kib.get(owner, 0) + size
            spans.append((start, size))
        spans.sort()
        starts, sizes, cursor = [], [], 0
        for start, size in spans:
            if start < cursor:
                raise ValueError(f"segments overlap at {start} KiB")
            if start > cursor:
                starts.append(cursor)
                sizes.append(start - cursor)
            cursor = start + size
        if cursor < total_kib:
            starts.append(cursor)
            sizes.append(total_kib - cursor)
        ledger._hole_starts, ledger._hole_sizes = starts, sizes
        ledger._used = sum(size for _, size in spans)
        ledger._largest_hole = None
        return ledger

    def _free_range(self, start: int, size: int) -> None:
        """Return a range to the free list, merging with the holes on either side."""
        position = bisect.bisect_left(self._hole_starts, start)
        merges_left = position > 0 and self._hole_starts[position - 1] + self._hole_sizes[position - 1] == start
        merges_right = position < len(self._hole_starts) and start + size == self._hole_starts[position]
        if merges_left and merges_right:
            self._hole_sizes[position - 1] += size + self._hole_sizes[position]
            del self._hole_starts[position]
            del self._hole_sizes[position]
        elif merges_left:
            self._hole_sizes[position - 1] += size
        elif merges_right:
            self._hole_starts[position] = start
            self._hole_sizes[position] += size
        else:
            self._hole_starts.insert(position, start)
            self._hole_sizes.insert(position, size)
