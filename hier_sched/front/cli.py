"""The ``hier-sched`` command line.

Each package owns its commands (``estimators.cli``, ``replay.cli``, ``hier_sched.front.cluster_cli``,
``hier_sched.front.demo``); this module only gathers them. Heavy imports (torch, ray) happen inside
the commands so that ``hier-sched --help`` stays fast.
"""

from __future__ import annotations

import click

from estimators.cli import estimate, estimate_table, estimators_group
from hier_sched.front.bench.cli import bench
from hier_sched.front.cluster_cli import cluster_commands
from hier_sched.front.dashboard_shots import dashboard_shots
from hier_sched.front.demo import demo
from hier_sched.front.doctor import doctor
from replay.cli import replay
from traces.cli import traces_group


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="hier-sched")
def main() -> None:
    """Collocation-aware scheduling of deep-learning training jobs on Ray.

    \b
    Start here:
      hier-sched demo                       a local emulated cluster runs a real trace slice
      hier-sched up --emulated --nodes 2    start a local cluster with emulated GPUs
      hier-sched up --address HEAD:PORT     put the scheduler on a running Ray cluster
      hier-sched submit job.yaml            queue a job; then status / top / wait / logs / cancel
      hier-sched run job.yaml               submit, stream its output, exit with its code
      hier-sched replay --trace carma:philly_mix-90-tasks --compare
      hier-sched estimate --model pkg.mod:build --batch-size 64 --input-shape 3,224,224
      hier-sched bench decide               how long one scheduling decision takes at scale
      hier-sched doctor                     what the scheduler sees on this machine, and what to fix
    """


for command in (*cluster_commands, demo, replay, traces_group, estimate, estimate_table, estimators_group, bench,
                dashboard_shots, doctor):
    main.add_command(command)
