"""Monitoring windows and the thesis' risk score — the one implementation used everywhere.

RAD-RM samples every GPU once per second into a rolling window of W samples and scores each
metric as ``0.2 mean + 0.2 median + 0.3 p95 + 0.1 p50 + 0.2 EMA(alpha = 2/(W+1))``
(FIELD_NOTES §1; "median" and "p50" are the same statistic, so the median weighs 0.3 in effect —
kept as published).

The live node feeds one sample per second. The simulator knows a GPU's metrics are constant
between events, so it feeds *runs*: ``observe(value, count=n)`` is exactly n one-second samples
of the same value. Both therefore see the same numbers, and the simulator does not pay for
seconds in which nothing happens.
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from dataclasses import dataclass

from hier_sched.core.gpu import GpuSample, Risk

__all__ = ["RiskWeights", "RiskWindow", "GpuMonitor", "DEFAULT_WINDOW"]

DEFAULT_WINDOW = 30  # samples (RAD-RM's code; the thesis text says 90)


@dataclass(frozen=True, slots=True)
class RiskWeights:
    mean: float = 0.2
    median: float = 0.2
    p95: float = 0.3
    p50: float = 0.1
    ema: float = 0.2


class RiskWindow:
    """A rolling window over the last ``size`` one-second samples of one metric."""

    __slots__ = ("size", "alpha", "weights", "_runs", "_count", "_sum", "_ema", "_sorted_cache")

    def __init__(self, size: int = DEFAULT_WINDOW, weights: RiskWeights = RiskWeights()):
        if size < 1:
            raise ValueError(f"window size must be >= 1 (got {size})")
        self.size = size
        self.alpha = 2.0 / (size + 1)
        self.weights = weights
        self._runs: deque[list] = deque()  # [value, count], oldest first
        self._count = 0
        self._sum = 0.0
        self._ema: float | None = None
        self._sorted_cache: list[tuple[float, int]] | None = None

    def __len__(self) -> int:
        return self._count

    def observe(self, value: float, count: int = 1) -> None:
        """Add ``count`` consecutive one-second samples of ``value``."""
        if count <= 0:
            return
        value = float(value)
        if self._ema is None:
            self._ema = value
        else:
            self._ema = value + (self._ema - value) * (1.0 - self.alpha) ** count
        kept = min(count, self.size)
        if self._runs and self._runs[-1][0] == value:
            self._runs[-1][1] += kept
        else:
            self._runs.append([value, kept])
        self._count += kept
        self._sum += value * kept
        while self._count > self.size:
            oldest = self._runs[0]
            drop = min(oldest[1], self._count - self.size)
            oldest[1] -= drop
            self._count -= drop
            self._sum -= oldest[0] * drop
            if oldest[1] == 0:
                self._runs.popleft()
        self._sorted_cache = None

    def mean(self) -> float:
        return self._sum / self._count if self._count else 0.0

    def quantile(self, q: float) -> float:
        """Linear-interpolated quantile, identical to ``numpy.quantile`` over the samples."""
        if not self._count:
            return 0.0
        runs = self._sorted_runs()
        pos = (self._count - 1) * q
        lo = int(pos)
        frac = pos - lo
        a = self._order_stat(runs, lo)
        if frac == 0.0:
            return a
        return a + frac * (self._order_stat(runs, lo + 1) - a)

    def ema(self) -> float:
        return self._ema if self._ema is not None else 0.0

    def risk(self) -> float:
        if not self._count:
            return 0.0
        w = self.weights
        median = self.quantile(0.5)
        return w.mean * self.mean() + w.median * median + w.p95 * self.quantile(0.95) + w.p50 * median + w.ema * self.ema()

    def _sorted_runs(self) -> list[tuple[float, int]]:
        if self._sorted_cache is None:
            merged: dict[float, int] = {}
            for value, count in self._runs:
                merged[value] = merged.get(value, 0) + count
            runs: list[tuple[float, int]] = []
            for item in merged.items():
                insort(runs, item)
            self._sorted_cache = runs
        return self._sorted_cache

    @staticmethod
    def _order_stat(runs: list[tuple[float, int]], k: int) -> float:
        seen = 0
        for value, count in runs:
            seen += count
            if k < seen:
                return value
        return runs[-1][0]


class GpuMonitor:
    """Windows for SMACT, SMOCC and DRAMA of one GPU plus its latest memory reading."""

    __slots__ = ("smact", "smocc", "drama", "last")

    def __init__(self, size: int = DEFAULT_WINDOW, weights: RiskWeights = RiskWeights()):
        self.smact = RiskWindow(size, weights)
        self.smocc = RiskWindow(size, weights)
        self.drama = RiskWindow(size, weights)
        self.last: GpuSample | None = None

    def observe(self, sample: GpuSample, count: int = 1) -> None:
        self.smact.observe(sample.smact, count)
        self.smocc.observe(sample.smocc, count)
        self.drama.observe(sample.drama, count)
        self.last = sample

    def risk(self) -> Risk:
        return Risk(self.smact.risk(), self.smocc.risk(), self.drama.risk())
