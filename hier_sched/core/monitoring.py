"""Monitoring windows and the thesis' risk score — the one implementation used everywhere.

RAD-RM samples every GPU once per second into a rolling window of W samples and scores each
metric as ``0.2 mean + 0.2 median + 0.3 p95 + 0.1 p50 + 0.2 EMA(alpha = 2/(W+1))``
(FIELD_NOTES §1; "median" and "p50" are the same statistic, so the median weighs 0.3 in effect —
kept as published).

The live node feeds one sample per second. The simulator knows a GPU's metrics are constant
between events, so it feeds *runs*: ``observe(values, count=n)`` is exactly n one-second samples
of the same values. Both therefore see the same numbers, and the simulator does not pay for
seconds in which nothing happens. A window holds several metrics sampled together (a GPU's
SMACT, SMOCC and DRAMA), so one run records all of them; statistics are computed when a score
is asked for, and cached until the next sample.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
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
    """A rolling window over the last ``size`` one-second samples of ``metrics`` values each."""

    __slots__ = ("size", "alpha", "weights", "metrics", "_runs", "_count", "_ema", "_stats")

    def __init__(self, size: int = DEFAULT_WINDOW, weights: RiskWeights = RiskWeights(), metrics: int = 1):
        if size < 1:
            raise ValueError(f"window size must be >= 1 (got {size})")
        self.size = size
        self.alpha = 2.0 / (size + 1)
        self.weights = weights
        self.metrics = metrics
        self._runs: deque[list] = deque()  # [count, values], oldest first
        self._count = 0
        self._ema: list[float] | None = None
        self._stats: list[float] | None = None  # per metric: the window part of the score

    def __len__(self) -> int:
        return self._count

    def observe(self, values: float | Sequence[float], count: int = 1) -> None:
        """Add ``count`` consecutive one-second samples of ``values`` (one per metric)."""
        vals = (float(values),) if isinstance(values, (int, float)) else tuple(map(float, values))
        if len(vals) != self.metrics:
            raise ValueError(f"expected {self.metrics} value(s) per sample, got {len(vals)}")
        self.observe_tuple(vals, count)

    def observe_tuple(self, vals: tuple[float, ...], count: int = 1) -> None:
        """``observe`` for a tuple of floats already in metric order (the hot path)."""
        if count <= 0:
            return
        ema = self._ema
        if ema is None:
            self._ema = list(vals)
        else:
            decay = (1.0 - self.alpha) ** count
            if self.metrics == 3:  # a GPU's window (the simulator feeds millions of runs): unrolled
                a, b, c = vals
                x, y, z = ema
                self._ema = [a + (x - a) * decay, b + (y - b) * decay, c + (z - c) * decay]
            else:
                self._ema = [v + (e - v) * decay for v, e in zip(vals, ema)]
        runs = self._runs
        if self._count == self.size and len(runs) == 1 and runs[0][1] == vals:
            return  # a full window of these very values stays as it is
        self._stats = None
        kept = min(count, self.size)
        if runs and runs[-1][1] == vals:
            runs[-1][0] += kept
        else:
            runs.append([kept, vals])
        self._count += kept
        excess = self._count - self.size
        while excess > 0:
            oldest = runs[0]
            drop = min(oldest[0], excess)
            oldest[0] -= drop
            excess -= drop
            if oldest[0] == 0:
                runs.popleft()
        self._count = min(self._count, self.size)

    def mean(self, metric: int = 0) -> float:
        if not self._count:
            return 0.0
        return sum(c * v[metric] for c, v in self._runs) / self._count

    def quantile(self, q: float, metric: int = 0) -> float:
        """Linear-interpolated quantile, identical to ``numpy.quantile`` over the samples."""
        if not self._count:
            return 0.0
        return _quantile(sorted((v[metric], c) for c, v in self._runs), self._count, q)

    def ema(self, metric: int = 0) -> float:
        return self._ema[metric] if self._ema is not None else 0.0

    def risk(self, metric: int = 0) -> float:
        return self.risks()[metric]

    def risks(self) -> list[float]:
        """The score of every metric."""
        if not self._count:
            return [0.0] * self.metrics
        w = self.weights
        if self._stats is None and len(self._runs) == 1:  # one value all along: mean = median = p95
            whole = w.mean + w.median + w.p50 + w.p95
            self._stats = [whole * v for v in self._runs[0][1]]
        if self._stats is None:
            stats = []
            for m in range(self.metrics):
                ordered = sorted((v[m], c) for c, v in self._runs)
                median, p95 = _quantile(ordered, self._count, 0.5), _quantile(ordered, self._count, 0.95)
                stats.append(w.mean * self.mean(m) + (w.median + w.p50) * median + w.p95 * p95)
            self._stats = stats
        return [s + w.ema * e for s, e in zip(self._stats, self._ema)]


def _quantile(ordered: list[tuple[float, int]], count: int, q: float) -> float:
    pos = (count - 1) * q
    lo = int(pos)
    a = _order_stat(ordered, lo)
    frac = pos - lo
    return a if frac == 0.0 else a + frac * (_order_stat(ordered, lo + 1) - a)


def _order_stat(ordered: list[tuple[float, int]], k: int) -> float:
    seen = 0
    for value, count in ordered:
        seen += count
        if k < seen:
            return value
    return ordered[-1][0]


class GpuMonitor:
    """The SMACT, SMOCC and DRAMA window of one GPU plus its latest reading."""

    __slots__ = ("window", "last", "_risk")

    def __init__(self, size: int = DEFAULT_WINDOW, weights: RiskWeights = RiskWeights()):
        self.window = RiskWindow(size, weights, metrics=3)
        self.last: GpuSample | None = None
        self._risk: Risk | None = None  # the score until the next sample (a snapshot asks often)

    def observe(self, sample: GpuSample, count: int = 1) -> None:
        self.observe_activity(float(sample.smact), float(sample.smocc), float(sample.drama), count)
        self.last = sample

    def observe_activity(self, smact: float, smocc: float, drama: float, count: int = 1) -> None:
        """The window only (the simulator knows memory exactly and skips building a sample)."""
        self.observe_tuple((smact, smocc, drama), count)

    def observe_tuple(self, activity: tuple[float, float, float], count: int = 1) -> None:
        """``observe_activity`` for a (SMACT, SMOCC, DRAMA) tuple of floats (the simulator's hot path)."""
        self.window.observe_tuple(activity, count)
        if count > 0:
            self._risk = None

    def risk(self) -> Risk:
        if self._risk is None:
            self._risk = Risk(*self.window.risks())
        return self._risk
