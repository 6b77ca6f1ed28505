"""The job's side of settled memory: "my GPU memory has reached its steady state".

A job's GPU reservation (its estimate) holds for its whole run, so that no neighbour is ever
placed on memory the job has been promised but not allocated yet (a job that is still loading
data, or has not run its first step). An estimate is rarely exact: a job that reserved more than
it uses keeps the rest from other jobs for as long as it runs. Once a job has run a couple of
training steps its memory is as large as it gets (the optimizer's state exists from the second
step on), and it can say so::

    import hier_sched as hs

    for step in range(start, steps):
        train_one_step()
        if step == start + 2:
            hs.memory_settled()      # from now on this job reserves what it holds, +3 %

The node then lowers the job's reservation to what it holds on its GPUs (plus the 3 % margin of
a measured peak), and gives the rest back to the GPU (``core.learning.settled_reservation``); it
never raises it. A job that grows past that afterwards may find the memory taken and crash with
an OOM (it is then recovered with a larger margin), so call it once the steps are steady.
Outside a job the scheduler started, it does nothing. Standard library only (``import
hier_sched`` stays light); the held memory is read from PyTorch when it is already imported.
"""

from __future__ import annotations

import os
import sys

from hier_sched.common.private_files import replace_private

__all__ = ["SETTLED_FILE_ENV", "memory_settled"]

# Where the node actor listens for it: a run's own file, named in the job's environment.
SETTLED_FILE_ENV = "HIER_SCHED_SETTLED_FILE"


def memory_settled(held_mib: float | None = None) -> bool:
    """Report that this job's GPU memory is steady. ``held_mib``: what it holds per GPU (the
    largest over its GPUs); by default what PyTorch's allocator has reserved on the busiest
    device. The node checks it against what it sees the job hold, and uses the larger. Returns
    whether the report was made (False outside a scheduled job)."""
    path = os.environ.get(SETTLED_FILE_ENV)
    if not path:
        return False
    if held_mib is None:
        held_mib = _torch_reserved_mib()
    replace_private(path, f"{max(0.0, float(held_mib)):.1f}\n")
    return True


def _torch_reserved_mib() -> float:
    torch = sys.modules.get("torch")  # never imported here: a job that uses the GPU has it already
    if torch is None or not torch.cuda.is_available():
        return 0.0
    return max(torch.cuda.memory_reserved(d) for d in range(torch.cuda.device_count())) / 2**20
