"""A simulation of PyTorch's CUDA caching allocator, replayed over an allocation trace.

What nvidia-smi shows for a PyTorch process is not the bytes of live tensors but the *segments*
the caching allocator reserved with cudaMalloc (plus the CUDA context). The rules modelled here are
the documented behaviour of ``c10/cuda/CUDACachingAllocator`` (PyTorch docs, "CUDA semantics ->
memory management"): requests round up to 512 B; requests <= 1 MiB come from a small pool of 2 MiB
segments, larger ones from a large pool whose new segments are 20 MiB for requests < 10 MiB and
the request rounded up to 2 MiB otherwise; a free block is found best-fit within its pool and split
when the remainder is worth keeping (small: >= 512 B, large: > 1 MiB); freed blocks merge with free
neighbours of the same segment; segments are not returned (no ``empty_cache``), so the reserved
total only grows. Peak reserved minus peak allocated is the fragmentation the estimate includes.

Except at the GPU's capacity, where two things keep a job that fits from reserving more than the
GPU has: a ``cudaMalloc`` that fails makes the allocator free every wholly unused cached segment and
retry; and a cuDNN workspace that still does not fit makes PyTorch take the next algorithm of
cuDNN's list, down to ones that need no workspace (so a workspace that cannot fit is left out).
Tensors that do not fit are kept: the job then needs more than the GPU, which is what it reports.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from hier_sched.core.gpu_types import GpuType

__all__ = ["AllocEvent", "AllocatorResult", "simulate"]

MIB = 2**20
_SMALL_REQUEST = 1 * MIB  # requests up to this size use the small pool
_MID_REQUEST = 10 * MIB  # large requests below this get a 20 MiB segment
_ROUND_LARGE = 2 * MIB


@dataclass(frozen=True, slots=True)
class AllocEvent:
    """``size`` > 0 allocates storage ``key``; ``size`` == 0 frees it. A ``workspace`` is a kernel's
    scratch buffer, which the kernel can do without when memory is short."""

    key: int
    size: int
    workspace: bool = False


@dataclass(frozen=True, slots=True)
class AllocatorResult:
    peak_allocated_bytes: int  # live (rounded) tensor bytes at their peak
    peak_reserved_bytes: int  # cudaMalloc'd segments: what nvidia-smi sees, minus the context
    segments: int


@dataclass(slots=True)
class _Block:
    segment: int
    offset: int
    size: int
    free: bool
    small: bool  # which pool: blocks never move between pools
    prev: "_Block | None" = None
    next: "_Block | None" = None


class _Pool:
    """Free blocks of one pool, sorted by (size, segment, offset) for best-fit lookup."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, int, int]] = []
        self._blocks: dict[tuple[int, int, int], _Block] = {}

    @staticmethod
    def _key(b: _Block) -> tuple[int, int, int]:
        return (b.size, b.segment, b.offset)

    def add(self, b: _Block) -> None:
        k = self._key(b)
        bisect.insort(self._keys, k)
        self._blocks[k] = b

    def remove(self, b: _Block) -> None:
        k = self._key(b)
        del self._keys[bisect.bisect_left(self._keys, k)]
        del self._blocks[k]

    def best_fit(self, size: int) -> _Block | None:
        i = bisect.bisect_left(self._keys, (size, -1, -1))
        return self._blocks[self._keys[i]] if i < len(self._keys) else None


def _round_request(size: int, block_bytes: int) -> int:
    return max(block_bytes, -(-size // block_bytes) * block_bytes)


def _segment_size(request: int, gpu: GpuType) -> int:
    if request <= _SMALL_REQUEST:
        return gpu.small_segment_mib * MIB
    if request < _MID_REQUEST:
        return gpu.large_segment_mib * MIB
    return -(-request // _ROUND_LARGE) * _ROUND_LARGE


def simulate(events: Iterable[AllocEvent], gpu: GpuType, capacity_bytes: int | None = None) -> AllocatorResult:
    """Replay ``events`` through the caching allocator rules; frees of unknown keys are ignored
    (storages that existed before tracing started and were never allocated in the trace).
    ``capacity_bytes``: what the process may reserve (the GPU minus its fixed costs); None: no limit."""
    pools = {True: _Pool(), False: _Pool()}  # keyed by "is small pool"
    live: dict[int, _Block] = {}
    roots: dict[int, _Block] = {}  # segment -> its first block (the whole segment once all merged)
    reserved = allocated = peak_reserved = peak_allocated = 0
    segments = 0
    for ev in events:
        if ev.size == 0:
            block = live.pop(ev.key, None)
            if block is None:
                continue
            allocated -= block.size
            _free(block, pools[block.small])
            continue
        if ev.key in live:
            raise ValueError(f"allocation trace reuses live storage key {ev.key}")
        request = _round_request(ev.size, gpu.allocator_block_bytes)
        small = request <= _SMALL_REQUEST
        pool = pools[small]
        block = pool.best_fit(request)
        if block is None:
            seg_size = _segment_size(request, gpu)
            if capacity_bytes is not None and reserved + seg_size > capacity_bytes:
                reserved -= _release_cached_segments(roots, pools)
                if ev.workspace and reserved + seg_size > capacity_bytes:
                    continue  # cuDNN falls back to an algorithm without this workspace
            block = _Block(segments, 0, seg_size, True, small)
            roots[segments] = block
            segments += 1
            reserved += seg_size
            peak_reserved = max(peak_reserved, reserved)
        else:
            pool.remove(block)
        remaining = block.size - request
        if remaining >= (gpu.allocator_block_bytes if small else _SMALL_REQUEST + 1):
            rest = _Block(block.segment, block.offset + request, remaining, True, small, block, block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = request
            pool.add(rest)
        block.free = False
        live[ev.key] = block
        allocated += block.size
        peak_allocated = max(peak_allocated, allocated)
    return AllocatorResult(peak_allocated, peak_reserved, segments)


def _release_cached_segments(roots: dict[int, _Block], pools: dict[bool, _Pool]) -> int:
    """Free every segment that is one free block (what the allocator does before it reports an
    out-of-memory error); returns the bytes given back."""
    released = 0
    for segment, root in list(roots.items()):
        if root.free and root.next is None:
            pools[root.small].remove(root)
            del roots[segment]
            released += root.size
    return released


def _free(block: _Block, pool: _Pool) -> None:
    block.free = True
    for neighbour in (block.prev, block.next):
        if neighbour is not None and neighbour.free:
            pool.remove(neighbour)
            if neighbour is block.prev:
                neighbour.size += block.size
                neighbour.next = block.next
                if block.next is not None:
                    block.next.prev = neighbour
                block = neighbour
            else:
                block.size += neighbour.size
                block.next = neighbour.next
                if neighbour.next is not None:
                    neighbour.next.prev = block
    pool.add(block)
