"""The local cluster of ``ray start`` processes: started on free ports (again on others when a
port was taken in between, as happens with other clusters starting on the same machine), and
stopped completely by its sessions — without touching any other Ray on the machine."""

from __future__ import annotations

import socket
from pathlib import Path

from hier_sched.front import local_cluster
from hier_sched.front.connection import gcs_answers
from hier_sched.front.local_cluster import (IDLE_WORKER_ENV, IDLE_WORKER_KEEP_MS, ClusterConfig, local_ray_alive,
                                            local_ray_processes, ray_start_env, start_local_ray, stop_local_ray)


def test_head_starts_again_on_other_ports_when_the_dashboard_port_was_taken(monkeypatch):
    real_free_port = local_cluster.free_port
    with socket.socket() as taken:  # "free" when chosen, taken when Ray binds it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(local_cluster, "free_port",
                            lambda preferred=None, floor=0: busy if preferred == 8265 else real_free_port(preferred, floor))
        local, address, dashboard = start_local_ray(ClusterConfig(nodes=1, gpus_per_node=1))
    try:
        assert dashboard != f"http://127.0.0.1:{busy}"
        assert len(local.sessions) == 1  # the failed head's session was ended and forgotten
        assert gcs_answers(address) and local_ray_alive(local)
        listening = _listening(local)
        dashboard_port = int(dashboard.rsplit(":", 1)[1])
        assert {ip for ip, port in listening if port == dashboard_port} == {"127.0.0.1"}  # loopback only
        raylets = [p for p in local_ray_processes(local) if p.name() == "raylet"]
        assert raylets and all(p.environ().get(IDLE_WORKER_ENV) == str(IDLE_WORKER_KEEP_MS) for p in raylets)
    finally:
        ended = stop_local_ray(local)
    assert ended >= 3  # GCS, raylet, dashboard at least
    assert not local_ray_alive(local)
    note = Path(local.session_dir).parent / "ray_current_cluster"  # "auto" must not find the dead cluster
    assert not note.exists() or not note.read_text().strip().endswith(f":{local.port}")


def _listening(local) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket the local cluster's processes listen on."""
    import psutil

    pids = {p.pid for p in local_cluster._members(local.sessions)}
    return {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.pid in pids}


def test_idle_workers_are_kept_a_minute_unless_the_user_says_otherwise(tmp_path):
    env = ray_start_env({"RAY_ADDRESS": "10.0.0.1:6379", "PATH": "/bin"}, tmp_path)
    assert env[IDLE_WORKER_ENV] == str(IDLE_WORKER_KEEP_MS) and "RAY_ADDRESS" not in env
    assert ray_start_env({IDLE_WORKER_ENV: "5000"}, tmp_path)[IDLE_WORKER_ENV] == "5000"
