"""``estimators evaluate --plots``: one predicted-vs-measured figure per family, drawn and not blank."""

import numpy as np
import pytest
from click.testing import CliRunner
from matplotlib.image import imread

from estimators.plots import Family, plot_families
from hier_sched.front.cli import main


def drawn(path):
    assert path.stat().st_size > 20_000, path
    pixels = imread(path)
    assert pixels.std() > 0.05, f"{path} looks blank"
    return pixels


def test_every_family_gets_a_figure_with_one_panel_per_estimator(tmp_path):
    measured = np.array([900.0, 2500, 8000, 30000])  # spans > 20x: log axes
    narrow = np.array([1500.0, 1700, 2100])
    families = [
        Family("wide", "wide", measured, {"A": measured * 1.05, "B": measured / 100, "ours": measured * 1.2},
               failed_mib=40000.0),
        Family("narrow", "narrow", narrow, {"A": np.array([1500.0, 40000, 2000])}, failed_mib=40000.0),
        Family("empty", "no rows", np.zeros(0), {"A": np.zeros(0)}),
    ]
    paths = plot_families(families, tmp_path)
    assert [p.name for p in paths] == ["estimates_wide.png", "estimates_narrow.png"]  # nothing to draw: no file
    wide, narrow_px = drawn(paths[0]), drawn(paths[1])
    assert wide.shape[1] > 1.3 * narrow_px.shape[1]  # three panels side by side against one (and its legend)


@pytest.mark.slow
def test_cli_evaluate_writes_the_four_families(tmp_path):
    res = CliRunner().invoke(main, ["estimators", "evaluate", "--json", "--plots", str(tmp_path)])
    assert res.exit_code == 0, res.output
    for family in ("mlp", "cnn", "transformer", "real"):
        drawn(tmp_path / f"estimates_{family}.png")
