"""Device physics of the emulated GPU: collocation slowdown, utilization aggregation, power.

Pure functions of plain numbers (no ledger, no clock) so the simulator and the live node compute
exactly the same figures. Every calibration constant of the emulated GPU lives here, next to the
measurement it was fitted to, except the sharing slowdown's, which the scheduler expects too and
which live in ``hier_sched.core.sharing_cost`` (fitted as told below);
``tests/device/test_gpu_model_calibration.py`` refits them from ``../shared/data`` and prints model
vs measurement.

Slowdown model (MPS and streams). A job's solo SMACT ``s`` is its demand on the GPU's compute
(fraction of the device's SM-time it uses when alone). Collocated jobs share a capacity of 1:

* fluid part: max-min fair ("water-filling") shares of the capacity; a job that gets less than
  it demands runs ``s / share`` times slower. Jobs whose combined demand fits (sum s <= 1) lose
  nothing here -- the reason collocating light jobs pays.
* sharing cost: ``1 + alpha * D + beta * O_i + gamma * (n - 1)**2`` with ``D`` the residents'
  total demand, ``O_i`` the other residents' demand and ``n`` the number of processes; charged
  as soon as a second process is resident. ``alpha``: contention in proportion to all activity
  (MPS server in the kernel path, shared L2/DRAM, time-slice switches). ``beta``: waiting behind
  others' time slices -- 0 under MPS (fitted), large for streams. ``gamma``: per-process cost that
  grows with the pairs of processes (host-side launch/PCIe/data-loader contention; the thesis
  measured super-linear PCIe traffic under MPS); it is what makes 7 light jobs cost 2-2.5x.
  ``gamma`` rests on that one 7-way point and on the SMACT taken for its workload (0.179): with a
  true SMACT of 0.3 the fluid part alone would explain it. Treat 5+ residents as extrapolation.

Slowdown inside a MIG slice (alone, isolated; Amdahl's law): the job's active fraction ``s``
stretches by the inverse of the slice's SM share ``f_c``, the rest (host work, data loading) does
not: ``(1 - s) + s / f_c``. No fitted constant; checked against the thesis' MIG findings.

Utilization aggregation: DCGM activities are fractions of time; independent jobs overlap, so the
device reads ``1 - prod(1 - x_i)`` -- saturating, never additive, never above 1.

Power: per-second board power of a training GPU is two-level -- ~78 W while its processes wait
(host work, data loading; the P-state stays up) and ~253 W while kernels run -- and the share of
busy seconds grows with SMACT. So: ``idle`` without processes, else
``wait + (busy - wait) * min(1, k * SMACT)``; ``wait`` and ``busy`` are stored as fractions of the
type's dynamic range ``max - idle`` so the A100 fit transfers to other types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hier_sched.core.sharing_cost import (
    MPS_CALIBRATION, STREAMS_CALIBRATION, SharingCalibration, shared_slowdowns, water_fill,
)

__all__ = [
    "SharingCalibration",
    "MPS_CALIBRATION",
    "STREAMS_CALIBRATION",
    "PowerCalibration",
    "POWER_CALIBRATION",
    "water_fill",
    "shared_slowdowns",
    "slice_slowdown",
    "overlap_union",
    "power_w",
]


@dataclass(frozen=True, slots=True)
class PowerCalibration:
    wait_level: float  # power with processes but no kernel running, as a fraction of (max - idle)
    busy_level: float  # power while kernels run, as a fraction of (max - idle)
    busy_per_smact: float  # share of busy time per unit of device SMACT (k)


# Fitted to the 1-Hz DCGM series run_12f6a.json (one training run on an A100-40GB, idle 53 W, cap
# 300 W): seconds above 150 W are busy (mean 252.9 W), the others wait (median 77.5 W); the busy
# share of 120-s windows against their mean SMACT, least squares through 0: k = 1.169. Window power
# rmse 5.1 W, energy of the run -0.6 %. (A straight line P = 57.8 + 295.7*SMACT fits the windows
# as well, rmse 4.6 W, but the run only spans SMACT 0.1-0.26; extrapolated to busy GPUs it exceeds
# every busy second and overstates the thesis' 60-task trace energy by ~10 %.)
POWER_CALIBRATION = PowerCalibration(wait_level=0.0993, busy_level=0.8093, busy_per_smact=1.169)


def slice_slowdown(smact: float, compute_share: float) -> float:
    """Slowdown of a job alone in a MIG slice holding ``compute_share`` of the GPU's SMs."""
    if not 0.0 < compute_share <= 1.0:
        raise ValueError(f"a slice's compute share must be in (0, 1], got {compute_share}")
    return 1.0 + smact * (1.0 / compute_share - 1.0)


def overlap_union(fractions: Sequence[float]) -> float:
    """Fraction of time at least one of several independent activities (each in [0, 1]) is on."""
    idle = 1.0
    for fraction in fractions:
        idle *= 1.0 - fraction
    return 1.0 - idle


def power_w(idle_w: float, max_w: float, smact: float, *, has_processes: bool,
            calibration: PowerCalibration = POWER_CALIBRATION) -> float:
    """Mean board power of a device at a given device SMACT."""
    if not has_processes:
        return idle_w
    busy_share = min(1.0, calibration.busy_per_smact * smact)
    level = calibration.wait_level + (calibration.busy_level - calibration.wait_level) * busy_share
    return idle_w + (max_w - idle_w) * level
