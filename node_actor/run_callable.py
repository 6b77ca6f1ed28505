"""Runs a Python callable job in its own process: ``python -m node_actor.run_callable IN OUT``.

``IN`` holds ``cloudpickle((fn, args, kwargs))``; the return value is pickled to ``OUT``. A
separate process (not the Ray worker itself) keeps callable jobs cancellable, logged and
classified exactly like command jobs: an exception prints its traceback and exits 1. It uses
the standalone ``cloudpickle`` (what Ray vendors): importing Ray here cost every function job
~0.5 s of CPU before it started.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import cloudpickle

from hier_sched.common.private_files import write_private


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m node_actor.run_callable PAYLOAD RESULT", file=sys.stderr)
        return 2
    payload_path, result_path = argv
    fn, args, kwargs = cloudpickle.loads(Path(payload_path).read_bytes())
    try:
        value = fn(*args, **kwargs)
    except BaseException:  # noqa: BLE001 - the job's own failure, reported through its log
        traceback.print_exc()
        return 1
    write_private(result_path, cloudpickle.dumps(value))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
