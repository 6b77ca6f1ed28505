"""The replay's figures are written, drawn (not blank) and laid out as documented (tiny traces: fast)."""

from click.testing import CliRunner
from matplotlib.image import imread

from hier_sched.core.presets import preset
from hier_sched.front.cli import main
from replay.cluster import ClusterShape
from replay.engine import Simulator
from replay.estimates import estimator_for
from replay.metrics import summarize
from replay.plots import plot_compare, plot_run
from traces.schema import Trace, TraceJob


def simulate(policy, *, nodes=1, gpus=2, record_series=None, estimator="oracle"):
    jobs = [TraceJob(f"j{i}", 60.0 * i, "w", 1, 1200 + 300 * i, 6000 + 2500 * i, smact=0.3, smocc=0.2, drama=0.2)
            for i in range(6)]
    sim = Simulator(Trace("tiny", jobs), ClusterShape.uniform(nodes, gpus), preset(policy), estimator_for(estimator),
                    record_series=record_series)
    wall = sim.run()
    return sim, summarize(sim, trace_name="tiny", policy=policy, estimator=estimator, sharing="mps", wall_s=wall,
                          seed=0)


def drawn(path):
    """The PNG's pixels: it must exist, be non-trivial in size, and not be one flat colour."""
    assert path.stat().st_size > 10_000, path
    pixels = imread(path)
    assert pixels.std() > 0.05, f"{path} looks blank"
    return pixels


def test_single_replay_draws_each_gpu_beside_exclusive(tmp_path):
    sim, result = simulate("magm")
    base_sim, base_result = simulate("exclusive", estimator="none")
    paths = plot_run(sim, result, tmp_path / "both", baseline=(base_sim, base_result))
    assert sorted(p.name for p in paths) == ["gpu_memory.png", "gpu_power.png", "gpu_smact.png", "jct_cdf.png"]
    alone = plot_run(sim, result, tmp_path / "alone")
    for name in ("gpu_memory.png", "gpu_power.png", "gpu_smact.png"):
        beside, single = drawn(tmp_path / "both" / name), drawn(tmp_path / "alone" / name)
        # two columns of panels (exclusive | magm) against one: clearly wider, same height class
        assert beside.shape[1] > 1.6 * single.shape[1], name
    assert len(alone) == 4


def test_many_gpus_become_a_heat_map_and_large_clusters_a_timeline(tmp_path):
    sim, result = simulate("magm", nodes=3, gpus=4)  # 12 GPUs: more than one row of lines each
    base = simulate("exclusive", nodes=3, gpus=4, estimator="none")
    heat = drawn(plot_run(sim, result, tmp_path / "heat", baseline=base)[0])
    assert heat.shape[0] < 1.5 * heat.shape[1]  # one row of two heat maps, not 12 rows of panels

    sim, result = simulate("magm", record_series=False)
    names = [p.name for p in plot_run(sim, result, tmp_path / "big", baseline=simulate("exclusive", record_series=False))]
    assert names == ["timeline.png", "jct_cdf.png"]
    drawn(tmp_path / "big" / "timeline.png")


def test_compare_chart(tmp_path):
    rows = [("exclusive", simulate("exclusive", estimator="none")[1]), ("MAGM", simulate("magm")[1]),
            ("ours: auto", simulate("auto")[1])]
    drawn(plot_compare(rows, tmp_path))


def test_cli_replay_writes_the_figures(tmp_path):
    res = CliRunner().invoke(main, ["replay", "--trace", "carma:test", "--policy", "magm", "--estimator", "oracle",
                                    "--plots", str(tmp_path)])
    assert res.exit_code == 0, res.output
    for name in ("gpu_memory.png", "gpu_smact.png", "gpu_power.png", "jct_cdf.png"):
        drawn(tmp_path / name)
        assert f"wrote {tmp_path / name}" in res.output


def test_figures_do_not_need_completed_jobs(tmp_path):
    """A run where nothing ran writes no figure, and says so by returning no path."""
    jobs = [TraceJob("huge", 0.0, "w", 1, 100, 10 ** 7, smact=0.3, smocc=0.2, drama=0.2)]  # fits no GPU: rejected
    sim = Simulator(Trace("none", jobs), ClusterShape.uniform(1, 1), preset("magm"), estimator_for("oracle"))
    wall = sim.run()
    result = summarize(sim, trace_name="none", policy="magm", estimator="oracle", sharing="mps", wall_s=wall, seed=0)
    assert plot_run(sim, result, tmp_path) == []
