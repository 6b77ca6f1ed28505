"""A local hier_sched cluster: a supervisor process that owns a Ray cluster (or attaches to one),
starts the scheduler's actors, and serves the CLI over a small local HTTP API.

    python -m hier_sched.local_cluster serve --state-dir DIR [--nodes 2 --gpus-per-node 4 ...]

``hier-sched up`` spawns this detached and returns once it reports ready; ``hier-sched down``
sends it SIGTERM, upon which it cancels running jobs, kills the actors it started and shuts
down the Ray cluster it started (never ``ray stop``: other users' Ray processes stay alive).

Why a supervisor with HTTP: a CLI call that connects to Ray as a driver costs seconds on a
small machine; a JSON request to a process that already holds the actor handles costs
milliseconds, and the CLI stays free of the Ray import. The API listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from hier_sched.paths import state_dir

__all__ = ["ClusterConfig", "state_dir", "state_file", "read_state", "serve", "api_call", "ApiError",
           "free_port", "NODE_NAME_PREFIX"]

STATE_FILE = "cluster.json"
NODE_NAME_PREFIX = "node"
_DASHBOARD_PORT = 8265
_RAY_CLIENT_PORT_FLOOR = 20000  # FIELD_NOTES §3: keep the client server port outside 10002-19999


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    nodes: int = 2
    gpus_per_node: int = 4
    gpu_type: str = "A100-40GB"
    time_scale: float = 1.0
    policy: str = "auto"
    estimator: str = "auto"
    backend: str = "emulated"
    sharing: str = "mps"
    address: str | None = None  # attach to this Ray cluster instead of starting one
    cpus_per_node: int = 2
    mps_daemon: bool = False  # real GPUs: each node actor runs its own nvidia-cuda-mps-control

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(f"need at least 1 node and 1 GPU per node (got {self.nodes} x {self.gpus_per_node})")
        if self.time_scale <= 0:
            raise ValueError(f"--time-scale must be > 0 (got {self.time_scale})")


def state_file(directory: Path | None = None) -> Path:
    return (directory or state_dir()) / STATE_FILE


def read_state(directory: Path | None = None) -> dict[str, Any] | None:
    path = state_file(directory)
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def free_port(preferred: int | None = None, floor: int = 0) -> int:
    """``preferred`` when it is free, else a free port (above ``floor`` when given)."""
    candidates = ([preferred] if preferred else []) + list(range(floor, floor + 2000) if floor else [0])
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free TCP port")


class ApiError(RuntimeError):
    """The cluster is not reachable, or answered with an error."""


def api_call(method: str, payload: dict[str, Any] | None = None, *, directory: Path | None = None,
             timeout: float = 60.0) -> Any:
    """Call the running cluster's supervisor (what the CLI and the Python client use)."""
    import urllib.error
    import urllib.request

    state = read_state(directory)
    if state is None:
        raise ApiError(f"no hier_sched cluster is running (no {state_file(directory)}); start one with `hier-sched up`")
    request = urllib.request.Request(f"http://127.0.0.1:{state['api_port']}/{method}",
                                     data=json.dumps(payload or {}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise ApiError(exc.read().decode(errors="replace") or str(exc)) from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise ApiError(f"the hier_sched cluster at port {state['api_port']} does not answer ({exc}); "
                       "is it still up? (`hier-sched down` cleans up)") from None


# ---------------------------------------------------------------------- the supervisor
@dataclass(slots=True)
class _Supervisor:
    config: ClusterConfig
    directory: Path
    cluster: Any = None  # ray.cluster_utils.Cluster when we started Ray
    global_queue: Any = None
    node_actors: list[Any] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def start(self) -> dict[str, Any]:
        import ray

        cfg = self.config
        dashboard = None
        for stale in self.directory.glob("nodes/*/devices"):  # emulated GPUs of an earlier cluster
            shutil.rmtree(stale)
        if cfg.address is None:
            from ray.cluster_utils import Cluster

            from node_actor.launcher import NODE_RESOURCE_PREFIX, gpu_resource

            capacity = self._gpu_capacity()
            per_node = [{f"{NODE_RESOURCE_PREFIX}{NODE_NAME_PREFIX}{i}": 1.0,
                         **{gpu_resource(g): capacity for g in range(cfg.gpus_per_node)}} for i in range(cfg.nodes)]
            dashboard_port = free_port(_DASHBOARD_PORT)
            self.cluster = Cluster(initialize_head=True, shutdown_at_exit=True, head_node_args=dict(
                num_cpus=cfg.cpus_per_node, resources=per_node[0], include_dashboard=True,
                dashboard_host="127.0.0.1", dashboard_port=dashboard_port,
                ray_client_server_port=free_port(floor=_RAY_CLIENT_PORT_FLOOR)))
            for resources in per_node[1:]:
                self.cluster.add_node(num_cpus=cfg.cpus_per_node, resources=resources)
            self.cluster.wait_for_nodes()
            _log(f"Ray cluster of {cfg.nodes} node(s) started")
            address = self.cluster.address
            dashboard = f"http://127.0.0.1:{dashboard_port}"
        else:
            address = cfg.address
        ray.init(address=address, namespace="hier_sched", log_to_driver=False)
        nodes = self._ray_nodes()
        self._start_actors(nodes)
        _log(f"scheduler actors ready on {len(nodes)} node(s)")
        return {"address": address, "dashboard": dashboard, "nodes": [n for n, _, _ in nodes]}

    def _gpu_capacity(self) -> float:
        from hier_sched.core.gpu_types import gpu_type

        return float(gpu_type(self.config.gpu_type).memory_mib)

    def _ray_nodes(self) -> list[tuple[str, str, bool]]:
        """(scheduler node name, Ray node id, declares our per-GPU resources) per alive Ray node."""
        import ray

        from node_actor.launcher import NODE_RESOURCE_PREFIX

        alive = [n for n in ray.nodes() if n["Alive"]]
        named = []
        for position, n in enumerate(sorted(alive, key=lambda n: (not n.get("IsHeadNode", False), n["NodeID"]))):
            ours = [r for r in n["Resources"] if r.startswith(NODE_RESOURCE_PREFIX)]
            name = ours[0][len(NODE_RESOURCE_PREFIX):] if ours else f"{NODE_NAME_PREFIX}{position}"
            named.append((name, n["NodeID"], bool(ours)))
        return sorted(named)

    def _start_actors(self, nodes: list[tuple[str, str, bool]]) -> None:
        import ray

        from global_queue.actor import start_global_queue
        from node_actor.actor import start_node_actor

        cfg = self.config
        for name, node_id, declared in nodes:
            self.node_actors.append(start_node_actor(
                name, node_id, backend=cfg.backend, gpu_type=cfg.gpu_type, gpus=cfg.gpus_per_node,
                time_scale=cfg.time_scale, policy=cfg.policy, sharing=cfg.sharing, state_dir=str(self.directory),
                declared_resources=declared, use_mps_daemon=cfg.mps_daemon))
        ray.get([a.summary.remote() for a in self.node_actors])
        self.global_queue = start_global_queue([n for n, _, _ in nodes], policy=cfg.policy, estimator=cfg.estimator,
                                               time_scale=cfg.time_scale, gpu_type=cfg.gpu_type,
                                               state_dir=str(self.directory / "queue" / _generation()))
        ray.get(self.global_queue.status.remote())

    def stop(self) -> None:
        import ray

        try:
            if self.global_queue is not None:
                ray.get(self.global_queue.drain.remote(), timeout=30)
                ray.get(self.global_queue.stop.remote(), timeout=10)
            ray.get([a.shutdown.remote() for a in self.node_actors], timeout=20)
        except Exception as exc:  # noqa: BLE001 - stopping continues whatever the actors say
            print(f"warning: stopping the actors: {exc}", file=sys.stderr)
        for handle in [self.global_queue, *self.node_actors]:
            if handle is not None:
                try:
                    ray.kill(handle)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()

    # ------------------------------------------------------------------ the HTTP API
    def handle(self, method: str, body: dict[str, Any]) -> Any:
        import ray

        gq = self.global_queue
        if method == "submit":
            payload = base64.b64decode(body["payload"]) if body.get("payload") else None
            return ray.get(gq.submit.remote(body["spec"], payload))
        if method == "status":
            return ray.get(gq.status.remote(body.get("job_id")))
        if method == "history":
            return ray.get(gq.history.remote(body["job_id"]))
        if method == "cancel":
            return ray.get(gq.cancel.remote(body["job_id"]))
        if method == "checkpoint":
            return ray.get(gq.checkpoint.remote(body["job_id"]))
        if method == "logs":
            return ray.get(gq.read_log.remote(body["job_id"], int(body.get("offset", 0))))
        if method == "result":
            data = ray.get(gq.result.remote(body["job_id"]))
            return {"result": base64.b64encode(data).decode() if data is not None else None}
        if method == "cluster":
            return ray.get(gq.cluster.remote())
        raise KeyError(method)


def _generation() -> str:
    """A new queue for each cluster `up` starts: the queue survives restarts of its actor, and a
    cluster's `down` ends it (earlier generations stay on disk for inspection)."""
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


_T0 = time.time()


def _log(message: str) -> None:
    print(f"hier_sched [{time.time() - _T0:6.1f} s]: {message}", flush=True)


def _http_handler(supervisor: _Supervisor):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                answer, code = supervisor.handle(self.path.strip("/"), body), 200
            except KeyError as exc:
                answer, code = {"error": f"unknown API method {exc}"}, 404
            except Exception as exc:  # noqa: BLE001 - reported to the caller, the server goes on
                answer, code = {"error": f"{type(exc).__name__}: {exc}"}, 500
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:  # keep the supervisor log for real events
            return

    return Handler


def serve(config: ClusterConfig, directory: Path) -> int:
    """Run the supervisor until SIGTERM/SIGINT; writes ``cluster.json`` once ready."""
    os.environ["RAY_AUTH_MODE"] = "disabled"  # FIELD_NOTES §3: a stray auth token breaks workers
    directory.mkdir(parents=True, exist_ok=True)
    supervisor = _Supervisor(config, directory)
    started = time.time()
    try:
        info = supervisor.start()
    except Exception as exc:
        print(f"hier_sched: start failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        supervisor.stop()
        return 1
    # after ray.init: the Ray driver installs its own SIGTERM handler, which would exit at once
    # instead of cancelling the jobs and shutting the cluster down in order
    signal.signal(signal.SIGTERM, lambda *_: supervisor.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: supervisor.stopping.set())
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _http_handler(supervisor))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state = {**info, "pid": os.getpid(), "api_port": server.server_address[1], "config": asdict(config),
             "state_dir": str(directory), "started_at": started, "ready_s": round(time.time() - started, 2)}
    tmp = state_file(directory).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, state_file(directory))
    print(f"hier_sched: ready in {state['ready_s']} s; api port {state['api_port']}", flush=True)
    while not supervisor.stopping.wait(1.0):
        pass
    _log("stopping")
    server.shutdown()
    supervisor.stop()
    state_file(directory).unlink(missing_ok=True)
    _log("stopped")
    return 0


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hier_sched.local_cluster")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the supervisor (hier-sched up starts it detached)")
    s.add_argument("--state-dir", required=True)
    for name, kind in (("nodes", int), ("gpus-per-node", int), ("gpu-type", str), ("time-scale", float),
                       ("policy", str), ("estimator", str), ("backend", str), ("sharing", str), ("address", str),
                       ("cpus-per-node", int)):
        s.add_argument(f"--{name}", type=kind)
    s.add_argument("--mps-daemon", type=lambda v: v == "True", help="True: start an MPS control daemon per node")
    args = p.parse_args(argv)
    given = {k: v for k, v in vars(args).items() if v is not None and k not in ("command", "state_dir")}
    return serve(ClusterConfig(**given), Path(args.state_dir))


if __name__ == "__main__":
    sys.exit(_main())
