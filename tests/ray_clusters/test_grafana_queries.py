"""Every query of the Grafana dashboard (``docs/grafana/hier_sched.json``) answers, against a real
Prometheus that scrapes a real ``hier-sched up --emulated`` cluster: no panel shows "No data".

Before any job, every counter is already exported at 0 (``MetricDef.zero_tags``); then one short
job runs to success (the histograms get their first samples) and each PromQL expression of the
dashboard, with Grafana's variables filled in, must return at least one series. Prometheus is
Debian's package (``apt-get install --no-install-recommends prometheus``, README set-up); without
it the test skips and says so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import yaml
from conftest import ROOT

from hier_sched.common.metrics import METRICS
from hier_sched.front.local_cluster import free_port
from tests.helpers.cli_cluster import HS, cli_cluster

PROMETHEUS = shutil.which("prometheus")
GRAFANA_VARIABLES = {"$SessionName": ".+", "$node": ".+", "$__rate_interval": "1m", "$__range": "5m"}

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed "
                                "(`apt-get install --no-install-recommends prometheus`, README set-up)")


def dashboard_queries() -> list[str]:
    """Every ``expr`` of the dashboard's panels and the queries of its template variables."""
    found: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                found.append(node["expr"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads((ROOT / "docs" / "grafana" / "hier_sched.json").read_text()))
    return found


def _filled(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # inherited by `ray start`: metrics within ~1 s
    with cli_cluster(tmp_path_factory.mktemp("state"), nodes=1, gpus_per_node=1,
                     RAY_metrics_report_interval_ms="1000") as started:
        yield started



@pytest.fixture(scope="module")
def prometheus(cluster, tmp_path_factory):
    """A Prometheus of its own (own port, own data directory) scraping every node each second."""
    work = tmp_path_factory.mktemp("prometheus")
    targets = [urllib.parse.urlparse(u).netloc for u in cluster["info"]["metrics_urls"]]
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [{"job_name": "ray", "static_configs": [{"targets": targets}]}]}
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(work / "prometheus.log", "wb")
    process = subprocess.Popen([PROMETHEUS, f"--config.file={work / 'prometheus.yml'}",
                                f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                _get(f"{url}/-/ready")
                break
            except OSError:
                assert process.poll() is None and time.time() < deadline, (work / "prometheus.log").read_text()[-2000:]
                time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def test_every_counter_is_exported_at_zero_before_any_job(cluster):
    wanted = {f"ray_{d.name}" for d in METRICS if d.kind == "counter"}
    deadline, missing = time.time() + 60, wanted
    while missing and time.time() < deadline:
        text = "".join(_get(u).decode() for u in cluster["info"]["metrics_urls"])
        missing = {name for name in wanted if f"\n{name}{{" not in text}
        time.sleep(1)
    assert not missing, f"counters not exported before any job: {sorted(missing)}"


def test_every_grafana_query_returns_a_series(cluster, prometheus, tmp_path):
    # the team-queue panels need a queue configuration
    (tmp_path / "queues.yaml").write_text(yaml.safe_dump({"queues": [
        {"name": "team-a", "nominal": {"gpus": 1, "memory_mib": 20000}}]}))
    applied = subprocess.run([HS, "queues", "apply", str(tmp_path / "queues.yaml")], env=cluster["env"],
                             capture_output=True, text=True, timeout=120)
    assert applied.returncode == 0, applied.stderr
    spec = {"name": "grafana-probe", "command": ["python", "-c", "print('ok')"], "gpus": 1, "memory_mib": 3000,
            "estimator": "none", "emulation": {"peak_mib": 3000, "duration_s": 200, "smact": 0.3}, "queue": "team-a"}
    (tmp_path / "probe.yaml").write_text(yaml.safe_dump(spec))
    submitted = subprocess.run([HS, "submit", str(tmp_path / "probe.yaml")], env=cluster["env"], capture_output=True,
                               text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.split()[-1]
    waited = subprocess.run([HS, "wait", job, "--timeout", "240"], env=cluster["env"], capture_output=True, text=True,
                            timeout=300)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    queries = dashboard_queries()
    assert len(queries) >= 25
    unanswered = set(queries)
    deadline = time.time() + 120  # scrapes each second; increase() needs two samples after the job
    while unanswered and time.time() < deadline:
        for expr in sorted(unanswered):
            answer = json.loads(_get(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": _filled(expr)})))
            assert answer["status"] == "success", (expr, answer)
            if answer["data"]["result"]:
                unanswered.discard(expr)
        time.sleep(2)
    assert not unanswered, "Grafana queries without a series:\n" + "\n".join(sorted(unanswered))
    for variable, metric in (("SessionName", "ray_hier_sched_running_jobs"), ("node", "ray_hier_sched_gpu_memory_total_mib")):
        values = json.loads(_get(f"{prometheus}/api/v1/label/{variable}/values?" +
                                 urllib.parse.urlencode({"match[]": metric})))["data"]
        assert values, f"the dashboard's ${variable} variable would offer nothing"
