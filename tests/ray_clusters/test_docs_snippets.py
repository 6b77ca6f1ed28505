"""Documentation that runs as written, on a cluster ``hier-sched up --emulated`` started: the
README's Python example, and the tutorial's §4 (a job that lies about its memory) with the claim
under it. (Blocks that start and stop clusters themselves are left to the fixture.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from tests.helpers.cli_cluster import HS, cli_cluster



def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with cli_cluster(tmp_path_factory.mktemp("state"), nodes=1, gpus_per_node=1) as started:
        yield started["env"]



def test_the_readme_python_example_runs_as_written(cluster, tmp_path):
    (block,) = python_blocks((ROOT / "README.md").read_text())
    script = tmp_path / "example.py"
    script.write_text(block)
    ran = subprocess.run([sys.executable, str(script)], env=cluster, cwd=tmp_path, capture_output=True, text=True,
                         timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.strip().splitlines()[-1] == "3"


def test_the_tutorials_liar_runs_as_written_and_crashes_twice(cluster):
    """docs/tutorial.md §4: its shell block, run as written, then the claim under it."""
    tutorial = (ROOT / "docs" / "tutorial.md").read_text()
    section = tutorial[tutorial.index("## 4. A job that lies about its memory"):tutorial.index("## 5.")]
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    env = {**cluster, "PATH": f"{Path(HS).parent}{os.pathsep}{cluster.get('PATH', '')}"}  # hier-sched, as installed
    ran = subprocess.run(["bash", "-euc", block + '\nhier-sched status "$job" --json'], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    status = json.loads(ran.stdout[ran.stdout.index("{"):])
    assert status["state"] == "succeeded" and status["oom_crashes"] == 2, status
