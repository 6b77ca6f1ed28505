"""One look for every figure the project writes (replay and estimator plots).

Colours are Okabe & Ito's palette, which stays distinguishable under the common forms of colour
blindness; "exclusive" (the baseline every figure compares against) is always the same grey, the
run being judged always the same blue. Fonts are sized for a PNG read at 100 % on a laptop.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers or over SSH
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["OKABE_ITO", "BASELINE", "CHOSEN", "HIGHLIGHT", "figure_style", "save"]

# Okabe & Ito (2008), "Color Universal Design": blue, orange, bluish green, vermillion, reddish
# purple, sky blue, yellow, black.
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
BASELINE = "#7f7f7f"  # exclusive GPUs
CHOSEN = OKABE_ITO[0]  # the policy being looked at
HIGHLIGHT = OKABE_ITO[1]  # our own estimator / policy among others

_RC = {
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "figure.titlesize": 13,
    "axes.prop_cycle": matplotlib.cycler(color=OKABE_ITO),
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


@contextmanager
def figure_style():
    """The project's rc settings for the figures made inside the block."""
    with plt.rc_context(_RC):
        yield


def save(fig, path: Path) -> Path:
    """Write ``fig`` as a PNG (laid out so nothing overlaps) and free it."""
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
