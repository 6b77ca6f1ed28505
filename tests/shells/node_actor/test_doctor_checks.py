"""``hier-sched doctor``'s verdicts on stand-in facts (no GPU, no Ray)."""

from __future__ import annotations

from node_actor.doctor_checks import (FAIL, NA, PASS, WARN, Check, NvmlFacts, RayNodeFacts, ToolFacts, check_baselines,
                                      check_dcgm, check_gpu_types, check_mps, check_nvml, check_ray_nodes,
                                      check_scheduler, exit_code)

A100 = ("NVIDIA A100-SXM4-40GB", 40536.0)
H100 = ("NVIDIA H100 80GB HBM3", 81559.0)


def test_real_gpus_of_one_known_type_pass_and_unknown_or_mixed_ones_fail():
    ok = check_gpu_types(NvmlFacts(driver="550", nvml="12.550", devices=(A100, A100), types=("A100-40GB",) * 2), [])
    assert ok.status == PASS and "2 x A100-40GB" in ok.detail
    unknown = check_gpu_types(NvmlFacts(devices=(("NVIDIA B300", 180000.0),), types=("",)), [])
    assert unknown.status == FAIL and "NVIDIA B300" in unknown.detail and "gpu_types.py" in unknown.fix
    mixed = check_gpu_types(NvmlFacts(devices=(A100, H100), types=("A100-40GB", "H100-80GB")), [])
    assert mixed.status == FAIL and "A100-40GB, H100-80GB" in mixed.detail


def test_emulated_nodes_report_their_configured_types():
    check = check_gpu_types(NvmlFacts(error="no NVML"), [("node0", "A100-40GB"), ("node1", "H100-80GB")])
    assert check.status == PASS and check.detail == "emulated: node0: A100-40GB, node1: H100-80GB"
    assert check_gpu_types(NvmlFacts(error="no NVML"), []).status == FAIL


def test_nvml_dcgm_and_mps_do_not_apply_without_a_gpu_and_are_judged_with_one():
    assert {check_nvml(NvmlFacts(error="x"), False).status, check_dcgm(ToolFacts(None), False).status,
            check_mps(ToolFacts(None), False).status} == {NA}
    assert check_nvml(NvmlFacts(error="NVML Shared Library Not Found"), True).status == FAIL
    assert check_nvml(NvmlFacts(driver="550.54", nvml="12.550"), True).detail == "driver 550.54, NVML 12.550"
    assert check_dcgm(ToolFacts(None), True).status == WARN
    assert check_dcgm(ToolFacts("/usr/bin/dcgmi", "3.3", False, "host engine not running"), True).status == WARN
    assert check_dcgm(ToolFacts("/usr/bin/dcgmi", "3.3", True), True).status == PASS
    assert check_mps(ToolFacts(None), True).status == WARN
    assert check_mps(ToolFacts("/usr/bin/nvidia-cuda-mps-control", answered=True), True).status == PASS


def test_a_gpu_type_without_a_measured_baseline_fails_and_names_the_safe_value():
    recorded = {"A100-40GB": {"emulated device": 510.0}}
    assert check_baselines(["A100-40GB"], recorded, 1500).status == PASS
    missing = check_baselines(["A100-40GB", "H100-80GB"], recorded, 1500)
    assert missing.status == FAIL
    assert "not measured for H100-80GB: jobs there get the 1500 MiB safe value" in missing.detail
    assert "510 MiB (emulated device)" in missing.detail
    assert check_baselines([], {}, 1500).status == NA


def test_ray_nodes_must_declare_one_memory_resource_per_gpu():
    good = RayNodeFacts("10.0.0.1", True, {"CPU": 8, "GPU": 2, "hs_node_node0": 1, "hs_node0_gpu0_mem_mib": 40536,
                                           "hs_node0_gpu1_mem_mib": 40536})
    assert check_ray_nodes([good]).status == PASS
    short = RayNodeFacts("10.0.0.2", True, {"CPU": 8, "GPU": 2, "hs_node1_gpu0_mem_mib": 40536})
    assert "declares 1 GPU memory resources for 2 GPUs" in check_ray_nodes([good, short]).detail
    attached = RayNodeFacts("10.0.0.4", True, {"CPU": 8, "GPU": 2})  # `up --address`: none declared
    assert check_ray_nodes([good, attached]).status == WARN
    assert check_ray_nodes([RayNodeFacts("10.0.0.3", False, {})]).status == FAIL
    assert check_ray_nodes([], "not connected").status == FAIL


def test_a_slow_or_absent_scheduler_is_reported_and_any_failure_exits_1():
    assert check_scheduler(0.02).status == PASS
    assert check_scheduler(2.5).status == WARN
    assert check_scheduler(None, "no Ray cluster found").status == FAIL
    assert exit_code([Check("a", PASS, ""), Check("b", WARN, "")]) == 0
    assert exit_code([Check("a", PASS, ""), Check("b", FAIL, "")]) == 1
