"""MPS client environment, limit rules, and (where the binary exists) the daemon lifecycle."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_actor.mps import MpsController, MpsError, limits_by_client_index, mps_limits


def test_client_env_carries_limits_and_the_daemon_dirs(tmp_path: Path) -> None:
    mps = MpsController(tmp_path / "node-a")
    env = mps.client_env(active_thread_pct=40, pinned_mem_limit_mib={1: 8000, 0: 11999.2})
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "node-a" / "mps-pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "node-a" / "mps-log"),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=12000M,1=8000M",  # sorted, MiB rounded up
    }
    assert mps.client_env() == mps.daemon_env()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"active_thread_pct": 0}, "1..100"),
        ({"active_thread_pct": 101}, "1..100"),
        ({"active_thread_pct": 40.5}, "an int 1..100"),
        ({"pinned_mem_limit_mib": {0: 0}}, "must be > 0 MiB"),
        ({"pinned_mem_limit_mib": {-1: 100}}, "int >= 0"),
        ({"pinned_mem_limit_mib": {"GPU-abc": 100}}, "int >= 0"),
    ],
)
def test_client_env_rejects_bad_limits(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MpsController(tmp_path).client_env(**kwargs)


def test_limits_are_keyed_by_the_index_the_client_sees() -> None:
    # A 2-GPU job on node GPUs 3 and 1 (CUDA_VISIBLE_DEVICES=<uuid3>,<uuid1>) sees them as 0, 1.
    assert limits_by_client_index({3: 12000, 1: 8000}, [3, 1]) == {0: 12000, 1: 8000}
    with pytest.raises(ValueError, match=r"GPUs \[2\] that are not visible"):
        limits_by_client_index({2: 100}, [3, 1])


@pytest.mark.parametrize(
    ("reserved", "margin", "smact", "expected"),
    [
        (10000, 2048, None, (100, 12048)),  # unknown activity: no thread cap
        (10000.4, 0, 0.30, (60, 10001)),  # 2 x 30 %
        (5000, 512, 0.02, (20, 5512)),  # floor: never starve a job
        (5000, 512, 0.21, (45, 5512)),  # 42 % rounded up to a multiple of 5
        (5000, 512, 0.50, (100, 5512)),
        (5000, 512, 0.90, (100, 5512)),  # ceiling
    ],
)
def test_mps_limits_rules(
    reserved: float, margin: float, smact: float | None, expected: tuple[int, int]
) -> None:
    assert mps_limits(reserved, margin, smact) == expected


@pytest.mark.parametrize(
    ("reserved", "margin", "smact", "message"),
    [(0, 0, None, "reserved_mib"), (100, -1, None, "margin_mib"), (100, 0, 1.5, "smact_estimate")],
)
def test_mps_limits_rejects_nonsense(reserved: float, margin: float, smact: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mps_limits(reserved, margin, smact)


def test_missing_binary_is_reported(tmp_path: Path) -> None:
    availability = MpsController.available("no-such-mps-control")
    assert not availability and "not on PATH" in availability.reason
    mps = MpsController(tmp_path, binary="no-such-mps-control")
    assert not mps.is_running()
    with pytest.raises(MpsError, match="no-such-mps-control"):
        mps.start(timeout_s=2)
    with pytest.raises(MpsError, match="not running"):
        mps.command("get_server_list")


def test_state_dir_too_deep_for_unix_sockets(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Unix socket path limit"):
        MpsController(tmp_path / ("x" * 100))


def test_failing_daemon_start_is_reported(tmp_path: Path) -> None:
    with pytest.raises(MpsError, match="false -d exited 1"):
        MpsController(tmp_path, binary="false").start(timeout_s=2)


def test_daemon_start_query_stop(tmp_path: Path) -> None:
    """Runs where nvidia-cuda-mps-control exists (Debian's ``nvidia-cuda-mps`` runs the control
    daemon even without a GPU; only CUDA clients would fail)."""
    availability = MpsController.available()
    if not availability:
        pytest.skip(f"MPS control daemon not installed: {availability.reason}")
    mps = MpsController(tmp_path / "node")
    try:
        mps.start()
        pid = mps.daemon_pid()
        assert pid is not None
        mps.start()  # adopting a running daemon, not starting a second one
        assert mps.daemon_pid() == pid
        assert float(mps.command("get_default_active_thread_percentage")) == 100.0
        other_node = MpsController(tmp_path / "other")
        assert not other_node.is_running()  # daemons are per state dir
    finally:
        mps.stop()
    assert not mps.is_running()
    mps.stop()  # idempotent
