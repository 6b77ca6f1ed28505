"""classify_failure on realistic log tails: GPU OOM from each library vs everything else."""

from __future__ import annotations

import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hier_sched.core.failures import REQUEUE_EXIT_CODE, Failure, classify_failure

PYTORCH_OOM = """\
Epoch 3:  41%|####      | 412/1000 [01:12<01:43,  5.68it/s, loss=2.31]
Traceback (most recent call last):
  File "/home/u/train.py", line 88, in <module>
    loss.backward()
  File "/opt/venv/lib/python3.11/site-packages/torch/_tensor.py", line 626, in backward
    torch.autograd.backward(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity \
of 39.39 GiB of which 1.12 GiB is free. Process 4123 has 20.01 GiB memory in use. Of the allocated \
memory 35.02 GiB is allocated by PyTorch, and 1.63 GiB is reserved by PyTorch but unallocated.
"""

PYTORCH_OLD_OOM = """\
Traceback (most recent call last):
  File "main.py", line 40, in train
    output = model(images)
RuntimeError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 15.78 GiB total capacity)
"""

TF_RESOURCE_EXHAUSTED = """\
2024-03-02 10:11:12.123456: W tensorflow/core/common_runtime/bfc_allocator.cc:479] Allocator \
(GPU_0_bfc) ran out of memory trying to allocate 3.00GiB (rounded to 3221225472)requested by op Conv2D
Traceback (most recent call last):
  File "train_tf.py", line 51, in <module>
    model.fit(ds, epochs=10)
tensorflow.python.framework.errors_impl.ResourceExhaustedError: Graph execution error:
Detected at node 'model/conv2d_3/Conv2D' defined at (most recent call last):
    File "train_tf.py", line 51, in <module>
OOM when allocating tensor with shape[256,64,112,112] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc
	 [[{{node model/conv2d_3/Conv2D}}]]
"""

XLA_RESOURCE_EXHAUSTED = (
    "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to "
    "allocate 17179869184 bytes.\n"
)

CUBLAS_FAILURE = """\
Traceback (most recent call last):
  File "bert.py", line 120, in forward
    scores = torch.matmul(q, k.transpose(-1, -2))
RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`
"""

CUDA_RUNTIME_OOM = """\
terminate called after throwing an instance of 'c10::Error'
  what():  CUDA error: out of memory
CUDA kernel errors might be asynchronously reported at some other API call.
"""

TF_NON_OK_STATUS_ABORT = (
    "2024-03-02 10:11:12.1: F tensorflow/core/kernels/conv_ops.cc:1106] Non-OK-status: "
    "GpuLaunchKernel(...) status: Internal: out of memory\n"
)

VALUE_ERROR_MENTIONING_MEMORY = """\
Traceback (most recent call last):
  File "train.py", line 12, in <module>
    x = x.to(memory_format=fmt)
ValueError: memory_format must be torch.contiguous_format or torch.channels_last, got out-of-range value
"""

MISSING_COMMAND_PYTHON = """\
Traceback (most recent call last):
  File "launch.py", line 9, in <module>
    subprocess.run(["trainx", "--epochs", "3"], check=True)
  File "/usr/lib/python3.11/subprocess.py", line 1950, in _execute_child
    raise child_exception_type(errno_num, err_msg, err_filename)
FileNotFoundError: [Errno 2] No such file or directory: 'trainx'
"""

GRPC_RESOURCE_EXHAUSTED = (
    "grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with:\n"
    "\tstatus = StatusCode.RESOURCE_EXHAUSTED\n"
    '\tdetails = "Received message larger than max (536870912 vs. 104857600)"\n'
)

HOST_MEMORY_ERROR = """\
Traceback (most recent call last):
  File "prep.py", line 3, in <module>
    data = bytearray(10**13)
MemoryError
"""

DATALOADER_HOST_OOM = (
    "RuntimeError: DataLoader worker (pid 4321) is killed by signal: Killed. It is possible that "
    "dataloader's workers are out of memory. Please try to raise your shared memory limit.\n"
)


@pytest.mark.parametrize(
    ("log", "quoted"),
    [
        (PYTORCH_OOM, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
        (PYTORCH_OLD_OOM, "RuntimeError: CUDA out of memory. Tried to allocate 512.00 MiB"),
        (TF_RESOURCE_EXHAUSTED, "OOM when allocating tensor with shape[256,64,112,112]"),
        (XLA_RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED: Out of memory while trying to allocate"),
        (CUBLAS_FAILURE, "CUBLAS_STATUS_ALLOC_FAILED"),
        (CUDA_RUNTIME_OOM, "what():  CUDA error: out of memory"),
        ("[rank0] OOM detected at step 412, giving up\n", "OOM detected at step 412"),
        ("E: failed to alloc 2147483648 bytes on host: CUDA_ERROR_OUT_OF_MEMORY: out of memory\n",
         "CUDA_ERROR_OUT_OF_MEMORY"),
    ],
)
def test_gpu_oom_is_recognised_and_quoted(log: str, quoted: str) -> None:
    failure = classify_failure(1, log)
    assert failure is not None
    assert failure.kind == "oom"
    assert quoted in failure.reason
    assert "\n" not in failure.reason


def test_oom_wins_over_the_abort_it_caused() -> None:
    failure = classify_failure(-int(signal.SIGABRT), TF_NON_OK_STATUS_ABORT)
    assert failure is not None and failure.kind == "oom"
    assert "Non-OK-status" in failure.reason
    assert failure.signal == signal.SIGABRT


@pytest.mark.parametrize(
    ("log", "quoted"),
    [
        (VALUE_ERROR_MENTIONING_MEMORY, "ValueError: memory_format must be"),
        (MISSING_COMMAND_PYTHON, "FileNotFoundError: [Errno 2] No such file or directory: 'trainx'"),
        (GRPC_RESOURCE_EXHAUSTED, 'details = "Received message larger than max'),
        (HOST_MEMORY_ERROR, "MemoryError"),
        (DATALOADER_HOST_OOM, "RuntimeError: DataLoader worker (pid 4321) is killed"),
        # The thesis' bare keywords, out of any memory context.
        ("Connection attempt unsuccessful, retrying\nRuntimeError: rendezvous failed\n",
         "RuntimeError: rendezvous failed"),
        ("warning: BOOM detector tripped; ROOM full\nException: done\n", "Exception: done"),
        ("OOM killer invoked on the host\nRuntimeError: worker died\n", "RuntimeError: worker died"),
    ],
)
def test_non_oom_errors_are_errors_with_the_meaningful_line(log: str, quoted: str) -> None:
    failure = classify_failure(1, log)
    assert failure == Failure("error", failure.reason, 1, None)
    assert failure.reason.startswith("exit code 1: ")
    assert quoted in failure.reason


def test_shell_missing_command_names_the_exit_meaning() -> None:
    failure = classify_failure(127, "bash: line 1: trainx: command not found\n")
    assert failure is not None and failure.kind == "error"
    assert failure.reason == "exit code 127 (command not found): bash: line 1: trainx: command not found"


def test_success_and_requeue() -> None:
    assert classify_failure(0, PYTORCH_OOM) is None  # exit 0 is success whatever was printed
    requeue = classify_failure(REQUEUE_EXIT_CODE, "saved checkpoint to /ckpt/step_400.pt\n")
    assert requeue is not None and requeue.kind == "checkpoint_requeue"
    assert str(REQUEUE_EXIT_CODE) in requeue.reason


@pytest.mark.parametrize(
    ("exit_code", "sig", "kind", "text"),
    [
        (None, signal.SIGKILL, "killed", "killed by SIGKILL"),
        (-int(signal.SIGTERM), None, "killed", "killed by SIGTERM"),
        (128 + int(signal.SIGKILL), None, "killed", "killed by SIGKILL"),  # shell convention
        (-int(signal.SIGSEGV), None, "error", "crashed with SIGSEGV"),
        (None, signal.SIGUSR1, "killed", "killed by SIGUSR1"),  # checkpoint signal not handled
    ],
)
def test_signals(exit_code: int | None, sig: int | None, kind: str, text: str) -> None:
    failure = classify_failure(exit_code, "step 10 loss 0.3\n", signal=sig)
    assert failure is not None
    assert (failure.kind, failure.reason) == (kind, text)


@pytest.mark.parametrize("last_words", [
    "terminate called without an active exception",  # a gloo rank torn down after its peer left
    "what():  [enforce fail at gloo/transport/tcp/pair.cc:446] op.preamble.length <= op.nbytes",
    "Fatal Python error: _enter_buffered_busy: could not acquire lock for <_io.BufferedWriter name='<stdout>'>",
])
def test_a_native_crash_names_its_last_words(last_words: str) -> None:
    failure = classify_failure(134, f"rank 1: weights identical on every rank\n{last_words}\n")
    assert failure is not None and failure.reason.startswith("crashed with SIGABRT: ")
    assert last_words.split(":")[0] in failure.reason


def test_exit_code_above_128_without_a_signal_meaning_is_an_error() -> None:
    failure = classify_failure(200, "")
    assert failure is not None
    assert (failure.kind, failure.reason) == ("error", "exit code 200, no output")


def test_long_lines_are_shortened() -> None:
    failure = classify_failure(1, "torch.OutOfMemoryError: CUDA out of memory. " + "x" * 5000)
    assert failure is not None and len(failure.reason) < 260 and failure.reason.endswith("...")


def test_no_exit_status_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="has not ended"):
        classify_failure(None, "")


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-64, max_value=300), st.text(max_size=300))
def test_any_exit_status_and_log_gives_a_one_line_verdict(exit_code: int, log: str) -> None:
    failure = classify_failure(exit_code, log)
    if exit_code == 0:
        assert failure is None
    else:
        assert failure is not None and failure.reason and "\n" not in failure.reason
