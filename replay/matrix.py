"""The thesis' experiment matrix and its published figures, for ``replay --compare``.

Published figures are from the thesis (Ch. 6, real DGX Station A100, MPS): Fig. 6.5 / text
(90-task trace, oracle worst-fit = MAGM 30.13 % shorter than exclusive), Fig. 6.7 text (LUG
without estimate 28 % shorter), Fig. 6.9 text (MAGM + GPUMemNet ~25 % shorter), Table 6.5
(OOM crashes, 60-task trace) and Table 6.6 (energy, 60-task trace).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Run", "THESIS_MATRIX", "THESIS_FIGURES", "thesis_note"]


@dataclass(frozen=True, slots=True)
class Run:
    label: str
    policy: str
    estimator: str


THESIS_MATRIX: tuple[Run, ...] = (
    Run("exclusive", "exclusive", "none"),
    Run("RR + recovery", "round-robin", "none"),
    Run("MAGM, no estimate", "magm", "none"),
    Run("LUG, no estimate", "lug", "none"),
    Run("MAGM + Horus", "magm", "horus"),
    Run("MAGM + FakeTensor", "magm", "faketensor"),
    Run("MAGM + GPUMemNet", "magm", "gpumemnet"),
    Run("oracle first-fit", "first-fit", "oracle"),
    Run("oracle best-fit", "best-fit", "oracle"),
    Run("oracle MAGM (worst-fit)", "magm", "oracle"),
    Run("oracle LUG", "lug", "oracle"),
    Run("ours: auto + our estimator", "auto", "ours"),
)

# (trace, label) -> published figure. "time" = total trace time relative to exclusive.
THESIS_FIGURES: dict[tuple[str, str], dict[str, float]] = {
    ("philly_mix-90-tasks", "oracle MAGM (worst-fit)"): {"time": 1 - 0.3013},
    ("philly_mix-90-tasks", "LUG, no estimate"): {"time": 1 - 0.28},
    ("philly_mix-90-tasks", "MAGM + GPUMemNet"): {"time": 1 - 0.25},
    ("philly_heavy-60-tasks", "exclusive"): {"oom": 0, "energy_mj": 33.20},
    ("philly_heavy-60-tasks", "RR + recovery"): {"oom": 6, "energy_mj": 29.60},
    ("philly_heavy-60-tasks", "MAGM, no estimate"): {"oom": 4, "energy_mj": 28.78},
    ("philly_heavy-60-tasks", "LUG, no estimate"): {"oom": 4},
    ("philly_heavy-60-tasks", "MAGM + Horus"): {"oom": 2, "energy_mj": 29.04},
    ("philly_heavy-60-tasks", "MAGM + FakeTensor"): {"oom": 3, "energy_mj": 30.31},
    ("philly_heavy-60-tasks", "MAGM + GPUMemNet"): {"oom": 1, "energy_mj": 28.50},
}


def thesis_note(trace: str, label: str) -> str:
    """The published figures for one cell of the matrix, formatted for the table."""
    name = trace.split(":", 1)[-1]
    fig = THESIS_FIGURES.get((name, label))
    if not fig:
        return ""
    parts = []
    if "time" in fig:
        parts.append(f"time x{fig['time']:.2f}")
    if "oom" in fig:
        parts.append(f"{fig['oom']:.0f} OOM")
    if "energy_mj" in fig:
        parts.append(f"{fig['energy_mj']:.1f} MJ")
    return ", ".join(parts)
