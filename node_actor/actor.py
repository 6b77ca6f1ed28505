"""The ``NodeActor``: one per Ray node, owning that node's GPUs (a Ray shell around ``NodeRuntime``).

Pinned to its node (``NodeAffinitySchedulingStrategy``), ``num_cpus=0``, named
``hier_sched:node:<name>``, restartable: a restarted node actor re-adopts the runs its earlier
incarnation started (``RunTable.adopt``). A background thread samples the devices and collects
ended runs every ``tick_s`` wall seconds; the global queue calls ``exchange`` (snapshot, run
events, runs, in one round trip), ``launch``, ``stop`` and ``signal_checkpoint``. Jobs run as Ray
tasks (see ``launcher``) so their reservations show in ``ray status``; the node's fork server
(``fork_server``) starts their processes.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hier_sched.common.actor_names import NAMESPACE, node_actor_name
from hier_sched.common.messages import LaunchOrder, LaunchReply, NodeReport
from hier_sched.common.metrics import NodeMetrics, RaySink
from hier_sched.common.paths import check_job_id
from hier_sched.common.private_files import private_dir
from hier_sched.core.gpu import SharingMode
from hier_sched.core.presets import preset
from node_actor.backends import select_backend
from node_actor.emulated_device import emulated_now_s
from node_actor.fork_server import quit_server, server_address
from node_actor.job_task import run_job_task
from node_actor.launcher import RAY_GPU, AttemptEnded, LaunchRequest
from node_actor.mps import MpsController
from node_actor.runtime import NodeRuntime

__all__ = ["NodeActor", "RayLauncher", "start_node_actor"]

log = logging.getLogger(__name__)


RAY_RESOURCE_MODES = ("declared", "gpu_share", "none")


class RayLauncher:
    """Runs each job as a Ray task pinned to this node, asking Ray for (``ray_resources``):
    ``declared``: its share of ``GPU`` and its per-GPU MiB resources, on nodes that declare ours
    (clusters ``up`` started); ``gpu_share``: its share of ``GPU`` only, on nodes whose GPUs are
    fungible but declare nothing of ours (the workers an autoscaler of ``up --autoscale`` adds):
    a node that runs a job then never looks idle to the autoscaler; ``none``: nothing, on other
    clusters, where Ray's GPUs are exclusive units others may hold."""

    def __init__(self, node_id: str, ray_resources: str):
        if ray_resources not in RAY_RESOURCE_MODES:
            raise ValueError(f"ray_resources: one of {', '.join(RAY_RESOURCE_MODES)} (got {ray_resources!r})")
        self.node_id = node_id
        self.ray_resources = ray_resources
        self._ending: list[Any] = []  # tasks of ended runs, until their own end is read

    def launch(self, request: LaunchRequest, resources: dict[str, float], env: dict[str, str]) -> Any:
        # ``env`` (CUDA_VISIBLE_DEVICES, MPS limits...) reaches the job's processes through
        # ``run_process``. The task's runtime_env is the job's own, if any: one that differed per
        # job would make Ray start a fresh worker process for every job instead of reusing an idle
        # one (BENCHMARKS.md, "Launching a job"), and jobs of one Ray job share theirs.
        declared = ({} if self.ray_resources == "none" else
                    {RAY_GPU: resources.get(RAY_GPU, 0)} if self.ray_resources == "gpu_share" else resources)
        return run_job_task.options(
            num_gpus=declared.get(RAY_GPU, 0),
            resources={k: v for k, v in declared.items() if k != RAY_GPU},
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.node_id, soft=False),
            runtime_env=request.runtime_env,
            name=f"hs:{request.job_id}:attempt{request.files.attempt}",
        ).remote(request)

    def failed(self, handle: Any) -> str | None:
        ready, _ = ray.wait([handle], timeout=0)
        if not ready:
            return None
        try:
            ray.get(handle)
        except AttemptEnded:  # the job ran and failed: its exit file says how, not the task
            return None
        except RayError as exc:  # the worker died under the job: the job failed, the actor did not
            log.warning("a job's Ray task failed: %s", exc)  # the whole story (a runtime_env's, say)
            return f"the job's Ray task failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return None

    def ended(self, handle: Any) -> None:
        """Read the task's own end once it is there: a failed attempt's task raised
        (``AttemptEnded``), and an error nobody read is logged by Ray as unhandled."""
        self._ending.append(handle)
        ready, self._ending = ray.wait(self._ending, num_returns=len(self._ending), timeout=0)
        for ref in ready:
            try:
                ray.get(ref)
            except RayError:  # its outcome was read from the run's files
                pass


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=8)
class NodeActor:
    def __init__(self, name: str, *, backend: str = "emulated", gpu_type: str = "A100-40GB", gpus: int = 4,
                 time_scale: float = 1.0, policy: str = "magm", sharing: str = "mps", state_dir: str,
                 ray_resources: str = "declared", use_mps_daemon: bool = False, tick_s: float = 0.1):
        self._label = f"{name}: {gpus}x {gpu_type} {backend}, sharing {sharing}, policy {policy}"
        self.name = name
        self.time_scale = time_scale
        self.tick_s = tick_s
        node_dir = Path(state_dir) / "nodes" / name
        private_dir(state_dir)  # the state directory and all in it: this user's only
        private_dir(node_dir)
        options: dict[str, Any] = {}
        device_dir = None
        if backend == "emulated":
            device_dir = str(node_dir / "devices")
            options = dict(directory=device_dir, gpu_type=gpu_type, count=gpus, sharing=sharing, time_scale=time_scale)
        self.backend = select_backend(backend, **options)
        mps = MpsController(node_dir) if sharing == "mps" else None
        self.mps_daemon = None
        if backend == "emulated":  # what an emulated process holds, probed through the emulated device
            _record_emulated_baseline(self.backend, state_dir)
        else:  # a real GPU: measure this node's process baseline first, without MPS
            _probe_baseline(state_dir)
        if mps is not None and use_mps_daemon and backend != "emulated":
            available = MpsController.available()
            if not available:
                raise RuntimeError(f"node {name}: MPS daemon requested but unavailable: {available.reason}")
            mps.start()
            self.mps_daemon = mps
        node_id = ray.get_runtime_context().get_node_id()
        self.runtime = NodeRuntime(name, self.backend, preset(policy), state_dir=node_dir,
                                   launcher=RayLauncher(node_id, ray_resources), sharing=SharingMode(sharing),
                                   emulated_device_dir=device_dir, mps=mps, host=node_id)
        server_address(node_dir)  # the node's fork server, started now rather than by the first job
        self.lock = threading.Lock()
        with self.lock:
            self.runtime.tick(self._now())
        self.metrics = NodeMetrics(name, RaySink())
        self._metrics_failed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"node-{name}", daemon=True)
        self._thread.start()


    def __repr__(self) -> str:
        """The Actors page's Repr (Ray asks once, after ``__init__``) and Ray's name for its tasks."""
        return f"NodeActor({self._label})"

    def _now(self) -> float:
        return emulated_now_s(self.time_scale)

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                with self.lock:
                    self.runtime.tick(self._now())
            except Exception:  # noqa: BLE001 - one bad tick must not end monitoring
                log.exception("node %s: monitoring tick failed", self.name)
            if self.metrics.due():
                self._publish()

    def _publish(self) -> None:
        """This node's GPU metrics (``hier_sched.common.metrics``)."""
        try:
            with self.lock:
                summary = self.runtime.summary(self._now())
                samples = [m.last for m in self.runtime.monitor.monitors]
            self.metrics.publish(summary, samples)
        except Exception:  # noqa: BLE001 - metrics must never stop monitoring; said once
            if not self._metrics_failed:
                log.exception("node %s: publishing metrics failed", self.name)
            self._metrics_failed = True

    # ------------------------------------------------------------------ the global queue's calls
    @ray.method(enable_task_events=False)  # polled: Ray's task list keeps the jobs, not this
    def exchange(self, ack: int = 0, incarnation: str | None = None, version: int = -1,
                 orders: list[LaunchOrder] | None = None) -> NodeReport:
        """Start the queue's launch ``orders``, then answer with their replies, the snapshot,
        unacknowledged run events and current runs, in one round trip ("nothing changed" when the
        snapshot and runs are still ``version``)."""
        replies = [self._launch(order) for order in orders or ()]
        with self.lock:
            report = self.runtime.exchange(self._now(), ack, incarnation, version)
        return replace(report, launched=replies) if replies else report

    def _launch(self, order: LaunchOrder) -> LaunchReply:
        """One launch order of ``exchange`` (the queue's only way to launch: its orders ride on its asks)."""
        with self.lock:
            try:
                return self.runtime.launch(order, self._now())
            except Exception as exc:  # noqa: BLE001 - a job that cannot start fails alone
                log.exception("node %s: launching %s failed", self.name, order.job_id)
                return LaunchReply(False, f"{type(exc).__name__}: {exc}")

    def stop(self, job_id: str, attempt: int, kill_after_s: float) -> bool:
        with self.lock:
            return self.runtime.stop(job_id, attempt, kill_after_s)

    def signal_checkpoint(self, job_id: str, attempt: int) -> bool:
        with self.lock:
            return self.runtime.signal_checkpoint(job_id, attempt)

    @ray.method(enable_task_events=False)  # polled: Ray's task list keeps the jobs, not this
    def summary(self) -> dict[str, Any]:
        with self.lock:
            return self.runtime.summary(self._now())

    @ray.method(enable_task_events=False)  # polled: Ray's task list keeps the jobs, not this
    def address(self) -> str:
        """This node's IP address: where rank 0 of a gang listens for the others."""
        return ray.util.get_node_ip_address()

    @ray.method(enable_task_events=False)  # polled: Ray's task list keeps the jobs, not this
    def gpu_totals(self) -> list[float]:
        with self.lock:
            return self.runtime.monitor.totals()

    @ray.method(enable_task_events=False)  # polled: Ray's task list keeps the jobs, not this
    def gpu_types(self) -> list[str]:
        """Each GPU's type (``gpu_types.GPU_TYPES`` names), in the order of ``gpu_totals``."""
        with self.lock:
            return [self.runtime.gpu_type] * len(self.runtime.monitor.totals())

    @ray.method(enable_task_events=False)  # polled: Ray's task list keeps the jobs, not this
    def read_log(self, job_id: str, offset: int = 0, limit: int = 1 << 20) -> tuple[str, int]:
        """Log text from ``offset`` (bytes) and the next offset, for ``logs --follow`` across hosts."""
        check_job_id(job_id)  # a name, never a path: no other directory's file is read
        path = self.runtime.state_dir / "jobs" / job_id / "output.log"
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(limit)
        except OSError:
            return "", offset
        return data.decode("utf-8", "replace"), offset + len(data)

    def shutdown(self) -> None:
        """Cancel every running job (used by ``down``) and stop monitoring."""
        with self.lock:
            self.runtime.stop_all(kill_after_s=3.0)
        deadline = time.time() + 5.0
        while self.runtime.runs.runs and time.time() < deadline:
            time.sleep(0.1)
        self._stop.set()
        quit_server(self.runtime.state_dir)
        if self.mps_daemon is not None:
            self.mps_daemon.stop()


def _probe_baseline(state_dir: str) -> None:
    """What a training process holds on this node's GPU besides its tensors (CUDA context, cuBLAS,
    cuDNN), measured by a tiny CUDA process before the MPS daemon starts (the probe's own
    requirement), recorded for the estimators of this GPU type and stack."""
    from estimators.baseline import record_probe
    from node_actor.baseline_probe import probe_process_baseline

    try:
        result = probe_process_baseline(0)
        if result is not None:
            record_probe(result.gpu_type, result.stack, result.baseline_mib, state=state_dir)
            log.info("process baseline %.0f MiB on %s (%s)", result.baseline_mib, result.gpu_type, result.stack)
    except Exception:  # noqa: BLE001 - the estimators fall back to learned, configured or default values
        log.exception("process-baseline probe failed")


def _record_emulated_baseline(backend: Any, state_dir: str) -> None:
    """The emulated node's baseline, measured like a real one (``baseline_probe.probe_emulated``)
    so that no placement on it rests on a default."""
    from estimators.baseline import record_probe
    from node_actor.baseline_probe import probe_emulated

    result = probe_emulated(backend.devices)
    if result is not None:
        record_probe(result.gpu_type, result.stack, result.baseline_mib, state=state_dir)
        log.info("process baseline %.0f MiB on %s (%s)", result.baseline_mib, result.gpu_type, result.stack)
    else:
        log.warning("process-baseline probe: emulated GPU 0 cannot take a probe process now")


def start_node_actor(name: str, node_id: str, **kwargs: Any):
    """Create (or find) the node actor of Ray node ``node_id``."""
    return NodeActor.options(
        name=node_actor_name(name), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(name, **kwargs)
