"""NvmlBackend against a stand-in for the ``pynvml`` module (there is no GPU here), plus the
backend registry and the device-name mapping."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hier_sched.core.gpu import GpuSample
from hier_sched.core.gpu_types import GPU_TYPES
from node_actor.backends import (
    BACKENDS,
    BackendUnavailable,
    DeviceBackend,
    MigDevice,
    NvmlBackend,
    select_backend,
)
from node_actor.backends import nvml as nvml_module
from node_actor.backends.device_names import gpu_type_for, is_compute_device

MIB = 1024 * 1024


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 — pynvml's own spelling
    pass


class NVMLError_NoPermission(NVMLError):  # noqa: N801
    pass


class NVMLError_NotFound(NVMLError):  # noqa: N801
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    pass


class FakePynvml:
    """Just the part of the ``pynvml`` module the backend calls, over a table of devices.

    Devices are dicts; a key missing from a device makes that query raise NotSupported, as
    NVML does for readings a GPU lacks.
    """

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_NotFound = NVMLError_NotFound
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, devices: list[dict], init_error: Exception | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.init_depth = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.init_depth += 1

    def nvmlShutdown(self) -> None:
        self.init_depth -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict:
        return self.devices[index]

    @staticmethod
    def _get(handle: dict, key: str):
        if key not in handle:
            raise NVMLError_NotSupported(key)
        return handle[key]

    def nvmlDeviceGetName(self, handle: dict) -> bytes:
        return self._get(handle, "name").encode()  # old pynvml releases return bytes

    def nvmlDeviceGetUUID(self, handle: dict) -> str:
        return self._get(handle, "uuid")

    def nvmlDeviceGetMemoryInfo(self, handle: dict) -> SimpleNamespace:
        total, used = self._get(handle, "memory_mib")
        return SimpleNamespace(total=total * MIB, used=used * MIB, free=(total - used) * MIB)

    def nvmlDeviceGetUtilizationRates(self, handle: dict) -> SimpleNamespace:
        gpu, memory = self._get(handle, "utilization")
        return SimpleNamespace(gpu=gpu, memory=memory)

    def nvmlDeviceGetPowerUsage(self, handle: dict) -> int:
        return self._get(handle, "power_mw")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: dict) -> int:
        return self._get(handle, "energy_mj")

    def _procs(self, handle: dict, key: str) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else mib * MIB)
            for pid, mib in self._get(handle, key)
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: dict) -> list[SimpleNamespace]:
        return self._procs(handle, "compute_procs")

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: dict) -> list[SimpleNamespace]:
        return self._procs(handle, "mps_procs")

    def nvmlDeviceGetMigMode(self, handle: dict) -> list[int]:
        return self._get(handle, "mig_mode")

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: dict) -> int:
        return self._get(handle, "mig_slots")

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: dict, slot: int) -> dict:
        mig = self._get(handle, "migs").get(slot)
        if mig is None:
            raise NVMLError_NotFound(slot)
        return mig

    def nvmlDeviceGetGpuInstanceId(self, handle: dict) -> int:
        return self._get(handle, "gi")

    def nvmlDeviceGetComputeInstanceId(self, handle: dict) -> int:
        return self._get(handle, "ci")


def a100(uuid: str, used_mib: float, **extra) -> dict:
    device = {
        "name": "NVIDIA A100-SXM4-40GB",
        "uuid": uuid,
        "memory_mib": (40960, used_mib),
        "utilization": (99, 12),
        "power_mw": 251_500,
        "energy_mj": 7_200_000,
        "compute_procs": [],
        "mps_procs": [],
        "mig_mode": [0, 0],
    }
    device.update(extra)
    return device


DGX_DISPLAY = {"name": "NVIDIA DGX Display", "uuid": "GPU-display", "memory_mib": (4096, 3)}


def test_samples_map_every_nvml_reading() -> None:
    fake = FakePynvml(
        [
            a100(
                "GPU-aaa",
                20480,
                # Under MPS the server shows in the compute list and the clients in the MPS list.
                compute_procs=[(5000, 900), (4242, 1000)],
                mps_procs=[(4242, 12000), (4343, None)],
            ),
            DGX_DISPLAY,
            a100("GPU-bbb", 3),
        ]
    )
    backend = NvmlBackend(nvml=fake)
    assert isinstance(backend, DeviceBackend)
    assert backend.gpu_count() == 2  # the display device is never offered to jobs
    assert backend.uuids() == ["GPU-aaa", "GPU-bbb"]
    assert backend.gpu_type() == "A100-40GB"
    first, second = backend.sample()
    assert first == GpuSample(
        index=0,
        uuid="GPU-aaa",
        memory_total_mib=40960,
        memory_used_mib=20480,
        smact=0.99,
        smocc=0.0,
        drama=0.12,
        power_w=251.5,
        energy_j=7200.0,
        processes=((4242, 12000.0), (4343, 0.0), (5000, 900.0)),
    )
    assert second.index == 2 and second.memory_free_mib == 40957  # NVML index kept
    backend.close()
    backend.close()
    assert fake.init_depth == 0


def test_missing_readings_degrade_to_zero_not_errors() -> None:
    bare = a100("GPU-old", 100)
    for key in ("utilization", "power_mw", "energy_mj", "mps_procs", "mig_mode"):
        del bare[key]
    backend = NvmlBackend(nvml=FakePynvml([bare]))
    (sample,) = backend.sample()
    assert (sample.smact, sample.drama, sample.power_w, sample.energy_j) == (0.0, 0.0, 0.0, 0.0)
    assert backend.mig_devices() == []


def test_mig_slices_are_listed_with_their_profiles() -> None:
    migs = {
        0: {"name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "uuid": "MIG-1", "memory_mib": (19968, 0),
            "gi": 1, "ci": 0},
        # slot 1 empty: slots need not be contiguous
        2: {"name": "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "uuid": "MIG-2", "memory_mib": (4864, 0),
            "gi": 5, "ci": 0},
    }
    fake = FakePynvml([a100("GPU-x", 0), a100("GPU-m", 0, mig_mode=[1, 1], mig_slots=7, migs=migs)])
    assert NvmlBackend(nvml=fake).mig_devices() == [
        MigDevice(1, "MIG-1", "3g.20gb", 19968, 1, 0),
        MigDevice(1, "MIG-2", "1g.5gb", 4864, 5, 0),
    ]


def test_unavailable_nvml_says_why() -> None:
    broken = FakePynvml([], init_error=NVMLError_LibraryNotFound("NVML Shared Library Not Found"))
    availability = NvmlBackend.available(broken)
    assert not availability
    assert "Library Not Found" in availability.reason
    with pytest.raises(BackendUnavailable, match="NVML could not start"):
        NvmlBackend(nvml=broken)
    only_display = FakePynvml([DGX_DISPLAY])
    with pytest.raises(BackendUnavailable, match="no compute GPU"):
        NvmlBackend(nvml=only_display)
    assert only_display.init_depth == 0
    assert not NvmlBackend.available(FakePynvml([]))
    assert NvmlBackend.available(FakePynvml([a100("GPU-a", 0)]))


def test_real_pynvml_on_this_gpu_less_machine_is_unavailable() -> None:
    """The real library imports but finds no driver here; a GPU node would pass this as well."""
    availability = NvmlBackend.available()
    if availability:
        pytest.skip("a real NVIDIA driver is present on this machine")
    assert availability.reason


@pytest.mark.parametrize(
    ("name", "memory_mib", "expected"),
    [
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),  # as nvidia-smi reports it (pmdlt nvsm)
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", 81920, "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("Tesla V100-SXM2-16GB", 16160, "V100-16GB"),
        ("Tesla T4", 15360, "T4"),
        ("NVIDIA GeForce RTX 3090", 24576, "RTX-3090"),
        ("NVIDIA L40S", 46068, "NVIDIA L40S"),  # unknown: returned unchanged
    ],
)
def test_gpu_type_from_device_name(name: str, memory_mib: float, expected: str) -> None:
    assert gpu_type_for(name, memory_mib) == expected


def test_every_table_type_is_found_from_its_own_name() -> None:
    for gpu_type in GPU_TYPES.values():
        driver_name = "NVIDIA " + gpu_type.name.replace("-", " ")
        assert gpu_type_for(driver_name, gpu_type.memory_mib) == gpu_type.name


def test_display_devices_are_not_compute_devices() -> None:
    assert not is_compute_device("NVIDIA DGX Display")
    assert is_compute_device("NVIDIA A100-SXM4-40GB")


def test_select_backend_names_and_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown device backend 'cuda'") as error:
        select_backend("cuda")
    assert all(name in str(error.value) for name in ("auto", *BACKENDS))
    fake = FakePynvml([a100("GPU-a", 0)])
    explicit = select_backend("nvml", nvml=fake)
    assert isinstance(explicit, NvmlBackend)
    explicit.close()

    if not NvmlBackend.available():
        with pytest.raises(BackendUnavailable, match="use the 'emulated' backend"):
            select_backend("auto")

    # With a working NVML library and no dcgmi on PATH, auto settles for NVML alone.
    monkeypatch.setattr(nvml_module, "_import_pynvml", lambda: fake)
    monkeypatch.setattr("shutil.which", lambda _name: None)
    chosen = select_backend("auto")
    assert chosen.name == "nvml" and chosen.uuids() == ["GPU-a"]
    chosen.close()


def test_registry_accepts_new_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[dict] = []

    def emulated(**options) -> NvmlBackend:
        built.append(options)
        return NvmlBackend(nvml=FakePynvml([a100("GPU-e", 0)]))

    monkeypatch.setitem(BACKENDS, "emulated", emulated)
    backend = select_backend("emulated", gpus=4)
    assert built == [{"gpus": 4}] and backend.uuids() == ["GPU-e"]
