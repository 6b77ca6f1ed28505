"""The ``dcgmi dmon`` parser on real recorded output and on broken output, and DcgmBackend
streaming a recording through a child process."""

from __future__ import annotations

import csv
import os
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hier_sched.common.paths import shared_dir
from hier_sched.core.gpu import GpuSample
from node_actor.backends import BackendUnavailable, DcgmBackend, MigDevice, NvmlBackend
from node_actor.backends.dcgm import dcgm_to_nvml_index
from node_actor.backends.dcgm_dmon import (
    THESIS_FIELD_IDS,
    DmonParser,
    DmonRow,
    parse_dcgmi_discovery,
)
from node_actor.backends.device_names import gpu_type_for, is_compute_device

SHARED = shared_dir()
RECORDED_DMON = SHARED / "data/telemetry/pmdlt/1024.128.dcgmi.txt"
GPUTL, MCUTL, GRACT, SMACT, SMOCC, TENSO, DRAMA = 203, 204, 1001, 1002, 1003, 1004, 1005
POWER, TOTEC = 155, 156


@pytest.fixture(scope="module")
def recorded_lines() -> list[str]:
    if not RECORDED_DMON.exists():
        pytest.skip(f"recorded DCGM output not found at {RECORDED_DMON} (set HIER_SCHED_SHARED)")
    return RECORDED_DMON.read_text().splitlines(keepends=True)


def test_recorded_dmon_output_parses_completely(recorded_lines: list[str]) -> None:
    parser = DmonParser()
    rows = parser.feed_lines(recorded_lines)
    entity_lines = [line for line in recorded_lines if line.startswith("GPU ")]
    assert len(rows) == len(entity_lines) == parser.rows_parsed
    assert not parser.skipped
    assert {row.entity_id for row in rows} == {0, 1, 2, 3, 4}
    assert all(set(row.values) == {GPUTL, MCUTL, GRACT, SMACT, SMOCC, TENSO, DRAMA} for row in rows)
    # The second tick of GPU 0, as printed: "GPU 0  91  0  0.488  0.081  0.027  0.002  0.000".
    assert rows[5] == DmonRow(
        "GPU", 0, {GPUTL: 91, MCUTL: 0, GRACT: 0.488, SMACT: 0.081, SMOCC: 0.027, TENSO: 0.002, DRAMA: 0.0}
    )
    # The micro-benchmark's point: the GPU looks busy (GPUTL) while its SMs are mostly idle.
    busy = parser.latest()[0]
    assert busy[GPUTL] >= 90 and busy[SMACT] < 0.2
    assert parser.latest()[3] == dict.fromkeys((GPUTL, MCUTL, GRACT, SMACT, SMOCC, TENSO, DRAMA), 0.0)


MALFORMED = """\
GPU 0     10     0.5
#Entity   POWER        TOTEC          SMACT    SMOCC    DRAMA    XYZZY
ID        W            mJ

GPU 0     250.12       123456789      0.810    0.300    0.410    7
GPU 1     N/A          N/A            N/A      N/A      N/A      N/A
Error: Unable to connect to the host engine. Retrying...
GPU 0     251.00       123457000      0.820    0.31
GPU 1     60.5         99999          -0.010   0.000    0.000    0
GPU 1     61.0         100000         abc      0.000    0.000    0
GPU x     1            2              3        4        5        6
#Entity   SMACT    DRAMA
ID
GPU 0     0.555    nan
GPU 2     0.1      0.2
GPU-I 1   0.9      0.9
GPU 2     0.3      0.
"""


def test_malformed_output_is_skipped_and_counted_never_raised() -> None:
    parser = DmonParser()
    rows = parser.feed_lines(MALFORMED.splitlines())
    assert parser.skipped == {
        "entity row before any header": 1,
        "unknown column 'XYZZY' (its values are ignored)": 1,
        "not a header or an entity row": 2,  # the error message and "GPU x"
        "4 values for 6 columns (truncated or garbled)": 1,
        "negative or non-finite value dropped": 2,  # -0.010 and nan
        "non-numeric value": 1,
    }
    assert len(rows) == 7
    latest = parser.latest()
    # GPU 0: the garbled row did not overwrite the good one; the later short header applies.
    assert latest[0] == {SMACT: 0.555}
    # GPU 1: N/A everywhere, then a row whose one negative value was dropped.
    assert latest[1] == {POWER: 60.5, TOTEC: 99999.0, SMOCC: 0.0, DRAMA: 0.0}
    # "0." is a number; the truncated-looking row still has the right column count.
    assert latest[2] == {SMACT: 0.3, DRAMA: 0.0}
    # MIG instances are their own entities, never mixed into the GPU rows.
    assert parser.latest("GPU-I") == {1: {SMACT: 0.9, DRAMA: 0.9}}


def test_known_field_order_parses_rows_without_a_header() -> None:
    parser = DmonParser(field_ids=(SMACT, POWER))
    assert parser.feed("GPU 3   0.25   180\n") == DmonRow("GPU", 3, {SMACT: 0.25, POWER: 180.0})
    parser.feed("#Entity  DRAMA\n")  # a header always wins over the preset order
    assert parser.feed("GPU 3   0.5\n") == DmonRow("GPU", 3, {DRAMA: 0.5})


DISCOVERY = """\
2 GPUs found.
+--------+----------------------------------------------------------------------+
| GPU ID | Device Information                                                   |
+--------+----------------------------------------------------------------------+
| 0      | Name: NVIDIA A100-SXM4-40GB                                          |
|        | PCI Bus ID: 00000000:07:00.0                                         |
|        | Device UUID: GPU-bbbb                                                |
+--------+----------------------------------------------------------------------+
| 1      | Name: NVIDIA A100-SXM4-40GB                                          |
|        | PCI Bus ID: 00000000:01:00.0                                         |
|        | Device UUID: GPU-aaaa                                                |
+--------+----------------------------------------------------------------------+
0 NvSwitches found.
"""


def test_dcgm_ids_join_nvml_indices_by_uuid() -> None:
    dcgm_uuids = parse_dcgmi_discovery(DISCOVERY)
    assert dcgm_uuids == {0: "GPU-bbbb", 1: "GPU-aaaa"}
    assert dcgm_to_nvml_index(dcgm_uuids, {0: "GPU-aaaa", 1: "GPU-bbbb", 2: "GPU-cccc"}) == {
        0: 1,
        1: 0,
    }


class StaticMemory:
    """A memory source with fixed readings, standing in for NVML."""

    name = "static"

    def __init__(self, indices: list[int]) -> None:
        self.samples = [
            GpuSample(i, f"GPU-{i}", 40960, 1000 * i, smact=0.5, power_w=50, energy_j=1.0)
            for i in indices
        ]
        self.closed = False

    def gpu_count(self) -> int:
        return len(self.samples)

    def sample(self) -> list[GpuSample]:
        return list(self.samples)

    def gpu_type(self) -> str:
        return "A100-40GB"

    def uuids(self) -> list[str]:
        return [s.uuid for s in self.samples]

    def mig_devices(self) -> list[MigDevice]:
        return []

    def close(self) -> None:
        self.closed = True


def _wait_for_rows(backend: DcgmBackend, rows: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while backend.rows_parsed < rows and time.monotonic() < deadline:
        time.sleep(0.01)
    assert backend.rows_parsed >= rows


def test_backend_streams_a_recording_and_merges_it_with_memory(recorded_lines: list[str]) -> None:
    memory = StaticMemory([0, 1, 2, 4])  # NVML index 3 is the display device on that station
    backend = DcgmBackend(
        memory,
        command=["cat", str(RECORDED_DMON)],
        dcgm_to_index={0: 1, 1: 0, 2: 2, 4: 4},  # DCGM id 0 is NVML index 1
        stale_after_s=60,
    )
    try:
        _wait_for_rows(backend, sum(line.startswith("GPU ") for line in recorded_lines))
        samples = {s.index: s for s in backend.sample()}
        assert samples[1].smact == pytest.approx(0.166) and samples[1].smocc == pytest.approx(0.054)
        assert samples[1].memory_used_mib == 1000  # memory comes from the memory backend
        assert samples[0].smact == 0.0  # DCGM's value replaces the memory backend's estimate
        # No POWER/TOTEC column in this recording: the memory backend's values stay.
        assert (samples[1].power_w, samples[1].energy_j) == (50, 1.0)
        assert set(backend.latest_fields()) == {0, 1, 2, 4}
        assert backend.gpu_count() == 4 and backend.uuids() == ["GPU-0", "GPU-1", "GPU-2", "GPU-4"]
    finally:
        backend.close()
    assert memory.closed and not backend.stream_alive


def test_stale_dcgm_values_fall_back_to_memory_backend() -> None:
    script = (
        "import sys, time\n"
        "print('#Entity SMACT POWER TOTEC'); print('ID - W mJ')\n"
        "print('GPU 0 0.9 200.5 3500000', flush=True)\n"
        "time.sleep(30)\n"
    )
    backend = DcgmBackend(
        StaticMemory([0]), command=[sys.executable, "-c", script], stale_after_s=0.3
    )
    try:
        _wait_for_rows(backend, 1)
        (fresh,) = backend.sample()
        assert (fresh.smact, fresh.power_w, fresh.energy_j) == (0.9, 200.5, 3500.0)
        assert backend.stream_alive
        time.sleep(0.4)
        (stale,) = backend.sample()
        assert (stale.smact, stale.power_w) == (0.5, 50)
    finally:
        started = time.monotonic()
        backend.close()
    assert time.monotonic() - started < 3  # terminate, not wait for the sleep
    assert not backend.stream_alive


def test_missing_tool_is_a_clear_error() -> None:
    memory = StaticMemory([0])
    with pytest.raises(BackendUnavailable, match="cannot start 'no-such-dcgmi'"):
        DcgmBackend(memory, command=["no-such-dcgmi", "dmon"])
    assert memory.closed
    with pytest.raises(ValueError, match="delay_ms"):
        DcgmBackend(StaticMemory([0]), command=["true"], delay_ms=10)


def test_dcgm_is_reported_unavailable_without_dcgmi() -> None:
    availability = DcgmBackend.available()
    if availability:
        pytest.skip("DCGM is installed on this machine")
    assert availability.reason


def test_recorded_nvidia_smi_devices_map_to_types() -> None:
    """The DGX Station's nvidia-smi recording lists a display device between its A100s."""
    recorded = SHARED / "data/telemetry/pmdlt/1024.128.nvsm.txt"
    if not recorded.exists():
        pytest.skip(f"recorded nvidia-smi output not found at {recorded}")
    rows = list(csv.DictReader(recorded.read_text().splitlines(), skipinitialspace=True))
    devices = {(row["name"], float(row["memory.total [MiB]"].split()[0])) for row in rows}
    schedulable = {gpu_type_for(name, mib) for name, mib in devices if is_compute_device(name)}
    assert schedulable == {"A100-40GB"}
    assert {name for name, _ in devices if not is_compute_device(name)} == {"NVIDIA DGX Display"}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=80),
            st.builds(
                lambda entity, values: f"{entity} {' '.join(values)}",
                st.sampled_from(["GPU 0", "GPU 1", "GPU-I 2", "GPU", "#Entity", "ID"]),
                st.lists(st.sampled_from(["0.5", "N/A", "-1", "nan", "x", "1e3", ""]), max_size=5),
            ),
        ),
        max_size=30,
    )
)
def test_parser_never_raises_and_accounts_for_every_line(lines: list[str]) -> None:
    parser = DmonParser(field_ids=(SMACT, DRAMA))
    rows = parser.feed_lines(lines)
    assert parser.rows_parsed == len(rows)
    for values in parser.latest().values():
        assert all(v >= 0 for v in values.values())


def test_default_command_and_discovery_with_a_stand_in_dcgmi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded_lines: list[str]
) -> None:
    """A fake ``dcgmi`` on PATH answers ``discovery -l`` and replays the recording for ``dmon``,
    so the backend's own invocation and UUID join run as on a real node."""
    discovery = tmp_path / "discovery.txt"
    discovery.write_text(
        "".join(
            f"| {dcgm_id} | Name: NVIDIA A100-SXM4-40GB |\n|   | Device UUID: GPU-{nvml_index} |\n"
            for dcgm_id, nvml_index in ((0, 1), (1, 0), (2, 2), (4, 4))
        )
    )
    argv_log = tmp_path / "dmon-argv.txt"
    fake_dcgmi = tmp_path / "bin" / "dcgmi"
    fake_dcgmi.parent.mkdir()
    fake_dcgmi.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = discovery ]; then cat "{discovery}"; exit 0; fi\n'
        f'echo "$@" > "{argv_log}"; cat "{RECORDED_DMON}"\n'
    )
    fake_dcgmi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_dcgmi.parent}{os.pathsep}{os.environ['PATH']}")

    if not NvmlBackend.available():
        assert "memory readings need NVML" in DcgmBackend.available().reason
    backend = DcgmBackend(StaticMemory([0, 1, 2, 4]), delay_ms=500)
    try:
        _wait_for_rows(backend, sum(line.startswith("GPU ") for line in recorded_lines))
        assert argv_log.read_text().split() == [
            "dmon", "-e", ",".join(map(str, THESIS_FIELD_IDS)), "-d", "500"
        ]
        busy = [s.index for s in backend.sample() if s.smact > 0.1]
        assert busy == [1]  # DCGM's GPU 0 is NVML's GPU 1 by UUID
    finally:
        backend.close()
