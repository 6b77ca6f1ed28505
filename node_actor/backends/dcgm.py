"""DCGM activity (SMACT, SMOCC, DRAMA, power, energy) on top of another backend's memory.

``dcgmi dmon`` runs as a long-lived child process printing one row per GPU every ``delay_ms``;
a reader thread feeds its stdout to ``DmonParser``. ``sample()`` takes the memory backend's
readings (NVML: exact memory, per-process memory, UUIDs) and overwrites the activity fields
with DCGM's newest values — only values younger than ``stale_after_s``, so a dead or stuck
``dcgmi`` degrades to the memory backend's own (conservative) figures instead of freezing the
monitoring window on old numbers.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from hier_sched.core.gpu import GpuSample
from node_actor.backends.base import Availability, BackendUnavailable, DeviceBackend, MigDevice
from node_actor.backends.dcgm_dmon import THESIS_FIELD_IDS, DmonParser, parse_dcgmi_discovery
from node_actor.backends.nvml import NvmlBackend

__all__ = ["DcgmBackend", "dcgm_to_nvml_index"]

log = logging.getLogger(__name__)

_SMACT, _SMOCC, _DRAMA, _POWER, _TOTEC = 1002, 1003, 1005, 155, 156


def dcgm_to_nvml_index(dcgm_uuids: Mapping[int, str], nvml_uuids: Mapping[int, str]) -> dict[int, int]:
    """Join DCGM GPU ids to NVML indices by UUID; GPUs only one side knows are left out."""
    index_by_uuid = {uuid: index for index, uuid in nvml_uuids.items()}
    return {
        dcgm_id: index_by_uuid[uuid]
        for dcgm_id, uuid in dcgm_uuids.items()
        if uuid in index_by_uuid
    }


def _dcgmi_discovery() -> str:
    """``dcgmi discovery -l``'s listing; fails when the DCGM host engine is not reachable."""
    try:
        probe = subprocess.run(
            ["dcgmi", "discovery", "-l"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BackendUnavailable(f"dcgmi discovery failed: {error}") from error
    if probe.returncode != 0:
        lines = (probe.stderr or probe.stdout).strip().splitlines()
        raise BackendUnavailable(
            "dcgmi discovery failed (is nv-hostengine running?)"
            + (f": {lines[-1]}" if lines else f", exit code {probe.returncode}")
        )
    return probe.stdout


class DcgmBackend:
    """DCGM activity + a memory backend (NVML by default).

    ``command`` replaces the ``dcgmi dmon`` invocation (any process printing dmon text works,
    e.g. ``cat`` of a recording). ``dcgm_to_index`` maps DCGM GPU ids to ``GpuSample.index``;
    ``None`` asks ``dcgmi discovery -l`` when the real tool is used, identity otherwise.
    """

    name = "dcgm"

    def __init__(
        self,
        memory: DeviceBackend | None = None,
        *,
        field_ids: Sequence[int] = THESIS_FIELD_IDS,
        delay_ms: int = 1000,
        command: Sequence[str] | None = None,
        dcgm_to_index: Mapping[int, int] | None = None,
        stale_after_s: float | None = None,
    ) -> None:
        if delay_ms < 100:
            raise ValueError(f"delay_ms={delay_ms}: DCGM samples at most every 100 ms")
        self._memory = memory if memory is not None else NvmlBackend()
        self._parser = DmonParser(field_ids)
        self._stale_after_s = stale_after_s if stale_after_s is not None else 5 * delay_ms / 1000
        self._lock = threading.Lock()
        self._closing = False
        self._row_time: dict[int, float] = {}  # DCGM GPU id -> monotonic time of its newest row
        if command is None:
            fields = ",".join(str(f) for f in field_ids)
            command = ["dcgmi", "dmon", "-e", fields, "-d", str(delay_ms)]
            if dcgm_to_index is None:
                dcgm_to_index = self._discover_id_map()
        self._index_of = dict(dcgm_to_index) if dcgm_to_index is not None else None
        try:
            self._process = subprocess.Popen(
                list(command),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,  # tool errors become counted, logged unparsable lines
                stdin=subprocess.DEVNULL,
                text=True,
                encoding="utf-8",
                errors="replace",  # a garbled byte becomes one unusable line, not a dead reader thread
                bufsize=1,
            )
        except OSError as error:
            self._memory.close()
            raise BackendUnavailable(f"cannot start {command[0]!r}: {error}") from error
        self._reader = threading.Thread(target=self._read_stream, name="dcgmi-dmon", daemon=True)
        self._reader.start()

    @classmethod
    def available(cls) -> Availability:
        if shutil.which("dcgmi") is None:
            return Availability(False, "dcgmi is not on PATH (DCGM is not installed)")
        try:
            listing = _dcgmi_discovery()
        except BackendUnavailable as error:
            return Availability(False, str(error))
        memory = NvmlBackend.available()
        if not memory:
            return Availability(False, f"DCGM runs but memory readings need NVML: {memory.reason}")
        return Availability(True, listing.strip().splitlines()[0] if listing.strip() else "")

    def _discover_id_map(self) -> dict[int, int] | None:
        try:
            listing = _dcgmi_discovery()
        except BackendUnavailable as error:
            log.warning("%s; assuming DCGM ids equal NVML indices", error)
            return None
        nvml_uuids = {s.index: s.uuid for s in self._memory.sample()}
        id_map = dcgm_to_nvml_index(parse_dcgmi_discovery(listing), nvml_uuids)
        if not id_map:
            log.warning("dcgmi discovery matched no NVML UUID; assuming DCGM ids equal NVML indices")
            return None
        return id_map

    def _read_stream(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            with self._lock:
                row = self._parser.feed(line)
                if row is not None and row.entity == "GPU":
                    self._row_time[row.entity_id] = time.monotonic()
        code = self._process.wait()
        if not self._closing:
            log.warning("dcgmi dmon exited with code %s; DCGM readings will go stale", code)

    @property
    def stream_alive(self) -> bool:
        return self._process.poll() is None

    @property
    def rows_parsed(self) -> int:
        with self._lock:
            return self._parser.rows_parsed

    @property
    def skipped(self) -> dict[str, int]:
        """Unusable dmon lines so far, by reason."""
        with self._lock:
            return dict(self._parser.skipped)

    def latest_fields(self) -> dict[int, dict[int, float]]:
        """Fresh DCGM values of every field, keyed by ``GpuSample.index`` then DCGM field id."""
        now = time.monotonic()
        with self._lock:
            latest = self._parser.latest("GPU")
            fresh = {
                gpu: fields
                for gpu, fields in latest.items()
                if now - self._row_time.get(gpu, -float("inf")) <= self._stale_after_s
            }
        if self._index_of is None:
            return fresh
        return {self._index_of[g]: f for g, f in fresh.items() if g in self._index_of}

    def sample(self) -> list[GpuSample]:
        fields_by_index = self.latest_fields()
        return [_with_dcgm(s, fields_by_index.get(s.index, {})) for s in self._memory.sample()]

    def gpu_count(self) -> int:
        return self._memory.gpu_count()

    def gpu_type(self) -> str:
        return self._memory.gpu_type()

    def uuids(self) -> list[str]:
        return self._memory.uuids()

    def mig_devices(self) -> list[MigDevice]:
        return self._memory.mig_devices()

    def close(self) -> None:
        self._closing = True
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._reader.join(timeout=3)
        self._memory.close()


def _with_dcgm(sample: GpuSample, fields: Mapping[int, float]) -> GpuSample:
    """DCGM's value where it has one, the memory backend's otherwise (field by field)."""
    return replace(
        sample,
        smact=fields.get(_SMACT, sample.smact),
        smocc=fields.get(_SMOCC, sample.smocc),
        drama=fields.get(_DRAMA, sample.drama),
        power_w=fields.get(_POWER, sample.power_w),
        energy_j=fields[_TOTEC] / 1000.0 if _TOTEC in fields else sample.energy_j,
    )
