"""One scripted scenario through both shells gives the same commands in the same order.

The simulator (``replay.engine.Simulator``) and the live queue's service (``QueueService``, the
GlobalQueue actor's body, with its write-ahead log on disk) each drive the same simulated world
(``replay.world.SimWorld``: emulated GPUs, jobs' progress, OOM at allocation). For the live
shell, Ray is replaced by fake node actors that answer from that world: their reports carry its
snapshots and the runs that ended, and launch orders, stops and checkpoint signals act on it.
Users submit and cancel through the service's own calls. Whatever differs between the shells —
how they turn what happened into events, the requeue and recovery rules, what they log — would
show up as a different command, or one at another time.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from global_queue.service import CallsOneAtATime, QueueService
from hier_sched.common.messages import LaunchReply, NodeReport, RunOnNode
from hier_sched.core.estimate_rules import believe
from hier_sched.core.events import (
    CancelRequested, Launch, LaunchDeclined, NodeDraining, NodeJoined, NodeLost, NodeUndrained, QueuesConfigured,
    Reject, RunEnded, SignalCheckpoint, Stop,
)
from hier_sched.core.failures import Failure
from hier_sched.core.learning import MEASURED_MARGIN
from hier_sched.core.lifecycle import GANG_DECLINED_KILL_AFTER_S
from hier_sched.core.presets import preset
from hier_sched.core.quotas import QueueQuota, QueueSetup
from replay.cluster import ClusterShape
from replay.engine import Simulator
from replay.estimates import TraceEstimator
from replay.world import SimWorld, SlotSettings
from traces.schema import Trace, TraceJob


def job(name, submit, duration, peak, need=None, gpus=1, **kw) -> TraceJob:
    return TraceJob(name, submit, f"workload-{name}", gpus, duration, peak, horus_mib=peak if need is None else need,
                    smact=0.3, smocc=0.1, drama=0.1, **kw)


# Two nodes of two A100-40GB. Times in seconds; the auto preset holds GPUs for a head after 2 h.
SCENARIO = [
    job("a", 0, 9000, 12000),
    job("b", 0, 8000, 14000),
    job("c", 5, 20000, 16000),
    job("d", 5, 20000, 9000),
    job("liar", 60, 3000, 34000, need=4000),           # collocated on its estimate, then OOM and recovery
    job("crash", 90, 500, 6000, exit_code=3),          # fails for another reason: no retry
    job("wide", 120, 6000, 36000, gpus=2),             # blocks: two near-empty GPUs of one node
    *[job(f"s{i}", 200 + 700 * i, 2500, 8000) for i in range(12)],   # a stream that keeps GPUs busy
    job("victim", 400, 30000, 5000),                   # cancelled while it runs
    job("never", 500, 1000, 39000),                    # cancelled while it waits
    job("huge", 600, 100, 50000),                      # no GPU can hold it: rejected
    job("gang", 9000, 6000, 10000, gpus=2, gpus_per_node=1),   # one rank on each node
    job("late", 11000, 9000, 6000),
]
CANCELS = [(3000.0, "victim"), (3100.0, "never")]
NODE_LOST, NODE_BACK = (13000.0, "node1"), 16000.0  # the gang loses a rank's node; it comes back later
SLOTS = SlotSettings(length_s=7000.0, grace_s=300.0)  # the cluster's slot: yields only to waiting jobs
SHAPE = ClusterShape.uniform(2, 2)
POLICY = "auto"


def normal(t: float, cmd, name_of) -> list[tuple]:
    """A command as the nodes meet it, with job ids replaced by job names (each shell names jobs
    its own way): a launch (its first rank's order carries it whole), a stop (with its SIGKILL
    delay) or a checkpoint signal on each node it names, a rejection."""
    n = name_of(cmd.job_id)
    t = round(t, 3)
    if isinstance(cmd, Launch):
        places = tuple((p.node, p.gpus, round(p.reserved_mib), p.exclusive) for p in cmd.placements)
        limit = None if cmd.memory_limit_mib is None else round(cmd.memory_limit_mib)
        return [(t, "launch", n, cmd.attempt, places, limit, replace(cmd.request, job_id=n), cmd.resume)]
    if isinstance(cmd, Stop):
        return [(t, "stop", n, cmd.attempt, node, cmd.kill_after_s) for node in cmd.nodes]
    if isinstance(cmd, SignalCheckpoint):
        return [(t, "signal", n, cmd.attempt, node) for node in cmd.nodes]
    assert isinstance(cmd, Reject)
    return [(t, "reject", n, cmd.reason)]


def in_time_order(log: list[tuple]) -> list[tuple]:
    """By time; within one instant in a fixed order (a live queue sends all of a step's launches
    before its stops and signals; the simulator carries commands out in the core's order)."""
    return sorted(log, key=lambda c: (c[0], repr(c)))


class RecordingSimulator(Simulator):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.log: list[tuple] = []
        self.holds: set[str] = set()  # jobs GPUs were held for
        self.assumed_on_old_snapshots = 0

    def step(self, events, *, plan):
        # runs the scheduler launched that the snapshots did not show yet, counted by this plan
        self.assumed_on_old_snapshots += plan and len(self.scheduler.unshown_launches)
        commands = super().step(events, plan=plan)
        self.log += [entry for c in commands for entry in normal(self.world.now, c, str)]
        self.holds |= {job for job, why in self.scheduler.job_queue.waiting.items() if any("holding" in w for w in why)}
        return commands

    def apply_now(self, events):
        commands = super().apply_now(events)
        self.log += [entry for c in commands for entry in normal(self.world.now, c, str)]
        return commands


def script(world: SimWorld) -> None:
    """What happens from outside: users cancel two jobs, a node is lost and comes back."""
    for t, name in CANCELS:
        world.inject(t, CancelRequested(name))
    t, node = NODE_LOST
    world.inject(t, NodeLost(node))
    world.inject(NODE_BACK, NodeJoined(node, tuple(g.device.memory_total_mib for g in world.cluster.gpus[node])))


class AutoWithoutAModel(TraceEstimator):
    """``auto`` as the live queue asks it for a spec that names no model factory: no estimate, and
    a measured peak of the same job replaces that (the core's rule decides both)."""

    def __init__(self):
        super().__init__("ours")

    def belief(self, tj):
        return believe("auto", declared_mib=None, ask=lambda rule: (None, "no estimate (no model.factory)"))


def simulate(report_delay_s: float, jobs=SCENARIO, shape=SHAPE, scripted=True, learns=False,
             queue_changes=(), drains=()) -> RecordingSimulator:
    trace = Trace("parity", jobs)
    estimator = AutoWithoutAModel() if learns else TraceEstimator("horus")
    sim = RecordingSimulator(trace, shape, preset(POLICY), estimator, slots=SLOTS,
                             report_delay_s=report_delay_s)
    if scripted:
        script(sim.world)
    for t, setup in queue_changes:
        sim.world.inject(t, QueuesConfigured(setup))
    for t, event in drains:
        sim.world.inject(t, event)
    sim.run()
    return sim


class WorldNodes(CallsOneAtATime):
    """Fake node actors answering from the simulated world (the ``NodeSet`` the service uses)."""

    def __init__(self, world: SimWorld, live_to_trace: dict[str, str]):
        super().__init__()
        self.world = world
        self.names = list(world.cluster.gpus)
        self.ids = live_to_trace  # the service's job ids -> the world's
        self.outbox: dict[str, list] = {n: [] for n in self.names}
        self.seq = 0
        self.log: list[tuple] = []  # what the queue asked of the nodes, as ``normal`` writes commands
        # (job, attempt, node) of each rank a node said it started: a gang the world declined whole has
        # its other ranks "started" here only, and their nodes report their end when stopped
        self.started: set[tuple[str, int, str]] = set()

    def report(self, event, node: str | None = None) -> None:
        """A run ended or settled in the world: ``node`` reports it (else its own; a whole run's:
        its first node), numbered."""
        live = next(k for k, v in self.ids.items() if v == event.job_id)
        node = node or event.node or self.world.jobs[event.job_id].placements[0].node
        self.seq += 1
        self.outbox[node].append((self.seq, replace(event, job_id=live), None))

    def reports(self, acks):
        reports = {}
        for node in self.names:
            if node in self.world.cluster.down:  # a lost node does not answer
                continue
            _, upto = acks.get(node, ("", 0))
            self.outbox[node] = [e for e in self.outbox[node] if e[0] > upto]
            runs = [RunOnNode(live, j.attempt, p) for live, trace_id in self.ids.items()
                    if (j := self.world.jobs[trace_id]).gpus for p in j.placements if p.node == node]
            live_of = {trace_id: live for live, trace_id in self.ids.items()}
            snapshot = [replace(g, resident_jobs=tuple(live_of.get(j, j) for j in g.resident_jobs))
                        for g in self.world.cluster._snapshot(node)]
            reports[node] = NodeReport(node, self.world.now, snapshot, "fake", list(self.outbox[node]), runs)
        return reports

    def call(self, node, method, *args):
        world = self.world
        if method == "gpu_totals":
            return [g.device.memory_total_mib for g in world.cluster.gpus[node]]
        if method == "gpu_types":
            return [world.cluster.gpu_type_of[node]] * len(world.cluster.gpus[node])
        if method == "address":
            return "127.0.0.1"
        if method == "launch":
            (order,) = args
            if order.rank == 0:  # the world starts a gang whole
                launch = order.launch
                self.log += normal(world.now, launch, self.ids.get)
                trace_id = self.ids[launch.job_id]
                cmd = replace(launch, job_id=trace_id, placements=tuple(replace(p, job_id=trace_id) for p in launch.placements))
                for event in world.carry_out([cmd]):
                    if isinstance(event, LaunchDeclined):  # the node's check of the order, against its devices
                        return LaunchReply(False, event.reason)
                    self.report(event)
            self.started.add((order.job_id, order.launch.attempt, node))
            return LaunchReply(True, order.placement.reason)
        if method == "stop":
            job_id, attempt, kill_after_s = args
            self.log.append((round(world.now, 3), "stop", self.ids[job_id], attempt, node, kill_after_s))
            ended = world.carry_out([Stop(self.ids[job_id], attempt, "stop", kill_after_s)])
            if not ended and (job_id, attempt, node) in self.started:  # a rank only this node ran
                ended = [RunEnded(self.ids[job_id], attempt, Failure("killed", "stop"), -15, node=node)]
            self.started.discard((job_id, attempt, node))
            for event in ended:
                self.report(event, node)  # (a gang's other rank, when its first node was lost)
            return True
        if method == "signal_checkpoint":
            job_id, attempt = args
            self.log.append((round(world.now, 3), "signal", self.ids[job_id], attempt, node))
            world.carry_out([SignalCheckpoint(self.ids[job_id], attempt, "signal")])
            return True
        raise AssertionError(f"unexpected node call {method}")


def live(tmp_path, report_delay_s: float, jobs=SCENARIO, shape=SHAPE, scripted=True,
         restart_at: float | None = None, learns=False, queue_changes=(), services: list | None = None,
         drains=()) -> list[tuple]:
    """The scenario through the live queue's service; what it asked of the nodes. ``restart_at``:
    the queue is restarted then (a new service rebuilt from its write-ahead log, the same nodes).
    ``queue_changes``: (time, setup) an operator applies (``hier-sched queues apply``).
    ``services``: each service the scenario started is appended to it. ``drains``: (time,
    ``NodeDraining`` or ``NodeUndrained``) an operator asks for (``hier-sched drain``/``undrain``)."""
    world = SimWorld(Trace("parity", jobs), shape, placement=preset(POLICY).placement, slots=SLOTS,
                     report_delay_s=report_delay_s)
    ids: dict[str, str] = {}
    nodes = WorldNodes(world, ids)
    # a node that misses one round is lost (the simulator learns of a loss the moment it happens)
    def start() -> QueueService:
        service = QueueService(nodes, state_dir=tmp_path / "queue", policy=POLICY, estimator="auto",
                               clock=lambda: world.now, node_timeout_s=0.0)
        if services is not None:
            services.append(service)
        return service

    service = start()
    rejected = []
    cancels = dict((name, t) for t, name in CANCELS)
    if scripted:
        script(world)
    for t, setup in queue_changes:
        world.inject(t, QueuesConfigured(setup))
    for t, event in drains:
        world.inject(t, event)
    while (instant := world.pop_instant()) is not None:
        arrivals, events, external, dirty, _ = instant
        if restart_at is not None and world.now >= restart_at:
            service.journal.close()
            service, restart_at = start(), None
            assert service.recovery["records"] > 0
        for tj in arrivals:
            # learns: the default estimator (auto) and no declared need; else the trace's horus
            # estimate, declared
            need = {} if learns else {"memory_mib": tj.horus_mib, "estimator": "none"}
            spec = {"name": tj.job_id, "command": ["train", tj.workload], "gpus": tj.gpus,
                    "gpus_per_node": tj.gpus_per_node, **need,
                    "slot": {"length_s": SLOTS.length_s, "grace_s": SLOTS.grace_s, "extend_when_idle": True},
                    "emulation": {"peak_mib": tj.peak_mib, "duration_s": tj.duration_s},
                    # a simulated job saves when signalled: the live one says it can
                    "user": tj.user, "checkpoint_dir": "ckpt"}
            answer = service.submit(spec)
            if "error" in answer:  # the live queue refuses at submission what admission rejects
                rejected += normal(world.now, Reject(tj.job_id, answer["problems"][0]), str)
                continue
            ids[answer["job_id"]] = tj.job_id
        for event in events:
            nodes.report(event)
        for event in external:  # node losses and returns reach the live queue by the nodes' silence
            if isinstance(event, CancelRequested):
                live_id = next(k for k, v in ids.items() if v == event.job_id)
                assert cancels[event.job_id] == world.now
                service.cancel(live_id)
            elif isinstance(event, QueuesConfigured):
                service.apply_queues(event.setup)
            elif isinstance(event, NodeDraining):
                until = None if event.deadline_s is None else event.deadline_s - world.now
                assert "error" not in service.drain_node(event.node, until, event.reason)
            elif isinstance(event, NodeUndrained):
                service.undrain_node(event.node)
        result = service.tick(plan=dirty)
        world.after_step(result.wake_at_s, dirty and service.scheduler.has_queued())
    service.tick()  # the last ends are reported
    service.journal.close()
    return in_time_order(nodes.log + rejected)


# Nodes report at once; as the live queue hears them (its tick plus a round trip); and so late
# that the post-launch grace is over before a node reports a launch: the planner must count its
# own launches (the core's ``LaunchLedger``) and nodes decline orders their devices no longer fit.
# Some runs restart the live queue from its log mid-scenario (a blocked head waiting for its GPUs
# to be held, with slots under way; runs signalled at their slot's end, still saving; the gang
# just placed; or with the gang's node lost): the restarted queue must carry on as if nothing had
# happened -- what the core decided on its own clock is in the log (``StepResult.decided`` and
# ``noted``), and each run's start as it was decided (``RunStarted.started_s``).
@pytest.mark.parametrize("report_delay_s, restart_at", [
    (0.0, None), (0.25, None), (45.0, None), (0.25, 9500.0), (45.0, 13500.0),
    (0.0, 3050.0), (0.0, 6730.0),
])
def test_both_shells_give_the_same_commands_in_the_same_order(tmp_path, report_delay_s, restart_at):
    simulator = simulate(report_delay_s)
    services: list[QueueService] = []
    sim, real = in_time_order(simulator.log), live(tmp_path, report_delay_s, restart_at=restart_at, services=services)
    # The live queue plans, as the simulator does, on one ClusterIndex updated per node whose
    # snapshot changed (``ReportedCluster``): a new index only when the nodes themselves change
    # (the first reports; node1 lost, then back), never once per tick.
    for service in services:
        assert 1 <= service.reported.rebuilt <= 3 and service.reported.updated > service.reported.rebuilt
    if report_delay_s > preset(POLICY).placement.launch_grace_s:
        assert simulator.assumed_on_old_snapshots
    # the scenario has what it should: an OOM recovered with a margin, a failure that is not
    # retried, a head that got GPUs held, a cancel of a running and of a waiting job, a rejection
    records = {name: simulator.jobs[name].managed for name in ("liar", "crash", "wide", "victim", "never")}
    assert records["liar"].oom_crashes >= 1 and records["liar"].state.value == "succeeded"
    assert records["crash"].state.value == "failed" and records["crash"].attempts == 1
    assert simulator.holds and all(simulator.jobs[j].state == "done" for j in simulator.holds)
    assert records["victim"].state.value == records["never"].state.value == "cancelled"
    gang = simulator.jobs["gang"].managed
    assert gang.state.value == "succeeded" and gang.lost_runs >= 1  # lost a rank's node
    assert sum(j.managed.preemptions for j in simulator.jobs.values() if j.managed) >= 1  # a slot ended
    kinds = {c[1] for c in sim}
    assert {"launch", "stop", "signal", "reject"} <= kinds
    assert any(c[1] == "launch" and c[-1] for c in sim)  # a run resumed from its checkpoint
    launches = [c for c in sim if c[1] == "launch"]
    assert any(c[2] == "liar" and c[3] == 2 and c[6].min_free_mib for c in launches)  # recovered with a margin
    assert any(c[2] == "wide" for c in launches)
    assert len(sim) == len(real)
    for a, b in zip(sim, real):
        assert a == b


def test_a_gang_whose_node_declines_is_requeued_and_its_started_rank_stopped_in_both_shells(tmp_path):
    """Nodes report 45 s late: "grow" has allocated more than its estimate by the time the gang is
    placed beside it on the stale picture, and that node declines its part. The simulator's nodes
    decline a gang whole and it is tried again at once; here the live node of the other rank has
    started it, and the core stops that rank (``LaunchDeclined.started``) and waits for its end
    before the gang is placed again: no second try on the stale picture."""
    jobs = [job("grow", 0, 600, 5900, need=4000), job("gang", 35, 300, 33000, gpus=2, gpus_per_node=1)]
    shape = ClusterShape.uniform(2, 1)
    simulator = simulate(45.0, jobs, shape, scripted=False)
    real = live(tmp_path, 45.0, jobs, shape, scripted=False)
    gang = simulator.jobs["gang"].managed
    assert gang.state.value == "succeeded" and gang.attempts == 1  # declined attempts taken back
    declines = [why for _, _, to, why in gang.history if to == "queued" and "declined" in why]
    assert len(declines) == 2 and "node0" in declines[0]
    sim = in_time_order(simulator.log)
    assert [c for c in sim if c[2] != "gang"] == [c for c in real if c[2] != "gang"]
    assert [c[0] for c in sim if c[1] == "launch" and c[2] == "gang"] == [35.0, 40.0, 645.0]
    assert [c[0] for c in real if c[1] == "launch" and c[2] == "gang"] == [35.0, 645.0]
    assert sim[-1] == real[-1] and real[-1][2] == "gang"  # the launch that ran, alike
    # the rank that started (node0's), stopped at the next tick: the nodes' replies come with their reports
    next_tick = min(c[0] for c in real if c[0] > 35.0)
    assert [c for c in real if c[1] == "stop"] == [(next_tick, "stop", "gang", 1, "node0", GANG_DECLINED_KILL_AFTER_S)]


def test_learned_peaks_replace_the_estimate_alike_in_both_shells(tmp_path):
    """Jobs of one workload without an estimate (``auto``, no model to trace): the first runs on
    the no-estimate gate; once it has succeeded, each later one reserves its measured peak plus
    the margin, in both shells (the live queue keeps the peak in its state directory)."""
    def rep(name, submit):
        return TraceJob(name, submit, "workload-rep", 1, 1000, 9000, smact=0.3, smocc=0.1, drama=0.1)

    jobs = [rep("r1", 0), rep("r2", 2000), rep("other", 2000), rep("r3", 4000)]
    shape = ClusterShape.uniform(1, 2)
    simulator = simulate(0.25, jobs, shape, scripted=False, learns=True)
    real = live(tmp_path, 0.25, jobs, shape, scripted=False, learns=True)
    assert in_time_order(simulator.log) == real
    needs = {c[2]: c[6].need_mib for c in real if c[1] == "launch"}
    learned = 9000 * (1 + MEASURED_MARGIN)
    assert needs["r1"] is None and needs["r2"] == needs["other"] == needs["r3"] == pytest.approx(learned)
    assert "measured peak" in simulator.jobs["r3"].managed.estimate_source


def test_team_queues_reclaim_alike_in_both_shells_through_a_change_of_configuration(tmp_path):
    """team-a borrows every GPU; team-b's jobs arrive and reclaim up to team-b's fair share (2 of
    the 4: its nominal 1 and half of the 2 no one is guaranteed), checkpoint first; then an
    operator gives team-b 3 GPUs, and its next job reclaims one more. Both shells, restarted
    from the log in one run."""
    teams = QueueSetup((QueueQuota("team-a", 1), QueueQuota("team-b", 1)))
    changed = QueueSetup((QueueQuota("team-a", 1), QueueQuota("team-b", 3)))
    changes = [(0.0, teams), (2500.0, changed)]
    jobs = ([job(f"a{i}", 1, 6000, 30000, user="team-a") for i in range(1, 5)]
            + [job(f"b{i}", 600, 2000, 30000, user="team-b") for i in (1, 2)] + [job("b3", 3000, 1000, 30000, user="team-b")])
    simulator = simulate(0.25, jobs, scripted=False, queue_changes=changes)
    sim = in_time_order(simulator.log)
    signals = [(c[0], c[2]) for c in sim if c[1] == "signal"]
    # team-b's first two jobs take back 2 GPUs (the newest runs), the change of quota one more
    assert signals == [(600, "a3"), (600, "a4"), (3000, "a4")]
    assert all(simulator.jobs[j].managed.state.value == "succeeded" for j in simulator.jobs)
    for restart_at in (None, 2800.0):
        assert live(tmp_path / str(restart_at), 0.25, jobs, scripted=False, queue_changes=changes,
                    restart_at=restart_at) == sim


@pytest.mark.parametrize("report_delay_s", [0.0, 0.25])
def test_drains_give_the_same_commands_in_both_shells(tmp_path, report_delay_s):
    """node1 is drained with a deadline shorter than a checkpoint takes: its runs are signalled,
    then stopped and requeued at the deadline; node0 is drained without one later (its runs save
    and wait, as node1 is still closed); node1 opens again and takes them all."""
    jobs = [job(f"j{i}", 0, 4000, 15000) for i in range(4)]
    drains = [(100.0, NodeDraining("node1", "maintenance", deadline_s=130.0)),
              (2000.0, NodeDraining("node0", "kernel upgrade")), (5000.0, NodeUndrained("node1"))]
    simulator = simulate(report_delay_s, jobs, scripted=False, drains=drains)
    real = live(tmp_path, report_delay_s, jobs, scripted=False, drains=drains)
    sim = in_time_order(simulator.log)
    assert sim == real
    assert [c[:3] for c in sim if c[1] == "stop" and c[0] == 130.0]  # the deadline stopped node1's runs
    launched_on = [(c[0], node) for c in sim if c[1] == "launch" for node, *_ in c[4]]
    assert not [t for t, node in launched_on if node == "node1" and 100.0 <= t < 5000.0]
    assert not [t for t, node in launched_on if node == "node0" and t >= 2000.0]
    assert all(simulator.jobs[j.job_id].state == "done" for j in jobs)
