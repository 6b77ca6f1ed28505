"""The device model: the emulated GPU, on a floor of its own above the core.

Memory (``gpu_memory``: the caching allocator's ledger), physics (``gpu_physics``: slowdown,
utilization, power, calibrated on measurements) and the device itself (``gpu_model``). The simulator
(``replay``) and the emulated node (``node_actor``) both run jobs on it; the core's decisions never
import it: a device model is not a scheduling rule (``tests/repo/test_architecture.py``).
"""
