"""The job spec: what a user submits, validated before anything is queued.

Validation uses pydantic (field-named errors for free); ``SpecError`` turns its report into one
readable message per problem, e.g. ``gpus: must be >= 1 (got 0)``. A spec arrives as a mapping
(``parse_spec``); reading one from a YAML, TOML or JSON file is ``hier_sched.common.spec_files``' job,
so the core does no I/O. ``check_fits`` rejects a spec no node of a given cluster can ever hold.

Whatever the input — wrong types, NaN or infinite numbers, integers too big for the scheduler's
64-bit event log, keys given twice, text that is not UTF-8, nesting too deep to parse, NUL bytes
in what reaches the operating system — the answer is a ``JobSpec`` or a ``SpecError`` naming the
field or the file (``tests/system/test_fuzz_inputs.py`` checks this on generated input).
"""

from __future__ import annotations

import difflib
import re
import reprlib
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, get_args

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from hier_sched.core.admission import AdmissionIndex
from hier_sched.core.estimate_rules import ESTIMATORS, Belief
from hier_sched.core.events import JobTicket
from hier_sched.core.gpu_types import check_gpu_type_patterns
from hier_sched.core.job_warmup import WARMUP_S
from hier_sched.core.runtime_env import check_runtime_env, env_var_problem
from hier_sched.core.slots import SLOT_GRACE_S, SLOT_KILL_AFTER_S, Slot
from hier_sched.core.tickets import make_ticket

__all__ = [
    "SpecError",
    "ModelSpec",
    "TrainingSpec",
    "SlotSpec",
    "EmulationProfile",
    "RetrySpec",
    "JobSpec",
    "ESTIMATORS",
    "parse_spec",
    "check_fits",
    "ticket_for_spec",
    "describe_error",
]

class SpecError(ValueError):
    """A job spec that cannot be accepted; the message names every offending field (each problem
    cut to a line, at most ``_MAX_PROBLEMS`` listed: a hostile spec cannot make a huge message)."""

    def __init__(self, problems: Sequence[str], source: str = "job spec"):
        cut = [p if len(p) <= _PROBLEM_CHARS else p[: _PROBLEM_CHARS - 3] + "..." for p in problems]
        if len(cut) > _MAX_PROBLEMS:
            cut = cut[:_MAX_PROBLEMS] + [f"... and {len(cut) - _MAX_PROBLEMS} more problems"]
        self.problems = cut
        self.source = source if len(source) <= _PROBLEM_CHARS else source[: _PROBLEM_CHARS - 3] + "..."
        super().__init__(f"invalid {self.source}: " + "; ".join(self.problems))


_PROBLEM_CHARS = 400
_MAX_PROBLEMS = 20


# Every integer of a spec travels in the scheduler's events, which its write-ahead log packs as
# 64-bit integers.
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
Int64 = Annotated[int, Field(ge=_INT_MIN, le=_INT_MAX)]


def _ordered(value: Any) -> Any:
    """An argv or a shape is ordered: a set (YAML ``!!set``) would give its items in any order."""
    if isinstance(value, (set, frozenset)):
        raise ValueError("must be a list (a set has no order)")
    return value


class _Strict(BaseModel):
    # allow_inf_nan=False: a NaN or infinite number is refused as a bad value of its field.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    """What the estimators need to know about the model."""

    factory: str | None = Field(None, pattern=r"^[\w.]+:[\w.]+$")  # "pkg.mod:build"
    # "pkg.mod:fn": the user's own training step, traced as written (``estimators.user_step``)
    step: str | None = Field(None, pattern=r"^[\w.]+:[\w.]+$")
    batch_size: int | None = Field(None, ge=1, le=_INT_MAX)
    input_shape: Annotated[tuple[Int64, ...] | None, BeforeValidator(_ordered)] = None
    optimizer: str = "adam"
    dtype: str = "float32"
    kind: Literal["mlp", "cnn", "transformer"] | None = None
    summary: str | None = None  # a torchsummary text file, for the feature-based estimator

    @model_validator(mode="after")
    def _shape_positive(self) -> "ModelSpec":
        if self.input_shape is not None and any(d < 1 for d in self.input_shape):
            raise ValueError(f"input_shape dimensions must be >= 1 (got {list(self.input_shape)})")
        if self.step is not None and self.factory is not None:
            raise ValueError("give factory (a model, run in the generic loop) or step (your own training step), "
                             "not both")
        return self


# The training set-up that decides an LLM step's memory (``estimators.llm``); names as users know them.
PRECISIONS = ("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed")  # "bf16": pure bf16; "-mixed": autocast
PEFT_METHODS = ("none", "lora", "dora", "ia3", "adapter", "adapter_v2")
QUANTIZATIONS = ("none", "nf4", "nf4-dq")  # a bitsandbytes 4-bit base; "-dq": double-quantised scales
TRAINING_OPTIMIZERS = ("adamw", "adam", "sgd", "adamw8bit", "paged_adamw", "paged_adamw8bit")
SHARDINGS = ("none", "ddp", "fsdp", "fsdp2", "zero1", "zero2", "zero3")
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down", "fc_in", "fc_out", "lm_head")


class TrainingSpec(_Strict):
    """How an LLM is trained, for its memory estimate: the architecture (a Hugging Face
    ``hf_model_type`` and the ``hf_config`` fields that fix its sizes; built without weights),
    precision, activation checkpointing, PEFT, a quantized base, optimizer, sharding and the batch.
    ``sharding: fsdp`` is FSDP with flat parameters (PyTorch's ``FullyShardedDataParallel``),
    ``fsdp2`` per-parameter sharding (``fully_shard``); ``zero1-3`` are DeepSpeed's stages."""

    hf_model_type: str = Field(min_length=1, max_length=100)
    hf_config: dict[str, Any] = Field(default_factory=dict)
    precision: Literal[PRECISIONS] = "bf16-mixed"  # type: ignore[valid-type]
    checkpointing: Literal["none", "block"] = "none"  # "block": each decoder block recomputed in backward
    peft: Literal[PEFT_METHODS] = "none"  # type: ignore[valid-type]
    lora_r: int = Field(8, ge=1, le=65536)
    lora_alpha: float = Field(16.0, gt=0)
    lora_dropout: float = Field(0.05, ge=0, lt=1)
    lora_targets: tuple[Literal[LORA_TARGETS], ...] = ("q", "v")  # type: ignore[valid-type]
    # PEFT's own defaults for Llama-family models: keys, values and the MLP's output projection
    ia3_targets: tuple[Literal[LORA_TARGETS], ...] = ("k", "v", "down", "fc_out")  # type: ignore[valid-type]
    quantization: Literal[QUANTIZATIONS] = "none"  # type: ignore[valid-type]
    optimizer: Literal[TRAINING_OPTIMIZERS] = "adamw"  # type: ignore[valid-type]
    sharding: Literal[SHARDINGS] = "none"  # type: ignore[valid-type]
    world_size: int = Field(1, ge=1, le=1_000_000)
    micro_batch: int = Field(1, ge=1, le=1_000_000)
    seq_len: int = Field(ge=1, le=100_000_000)
    grad_accum: int = Field(1, ge=1, le=1_000_000)

    @model_validator(mode="after")
    def _consistent(self) -> "TrainingSpec":
        if self.quantization != "none" and self.peft == "none":
            raise ValueError(f"quantization {self.quantization!r} needs a peft method: a quantized base cannot be "
                             "fully fine-tuned (its weights get no gradients)")
        if self.peft in ("lora", "dora") and not self.lora_targets:
            raise ValueError("lora_targets: name at least one of " + ", ".join(LORA_TARGETS))
        if self.peft == "ia3" and not self.ia3_targets:
            raise ValueError("ia3_targets: name at least one of " + ", ".join(LORA_TARGETS))
        if self.sharding == "none" and self.world_size > 1:
            raise ValueError(f"world_size {self.world_size} needs a sharding ({', '.join(SHARDINGS[1:])})")
        if self.sharding != "none" and self.world_size < 2:
            raise ValueError(f"sharding {self.sharding!r} needs world_size >= 2 (got {self.world_size})")
        return self


class SlotSpec(_Strict):
    """A fixed time slot: after ``length_s`` the job yields its GPUs; ``grace_s`` before that it
    receives the checkpoint signal, saves, exits with the requeue code and is resumed later.
    ``extend_when_idle``: when no job waits at the slot's end, keep running for another slot
    instead (a job's own slot is a hard slot unless it says so; the cluster's default slot, a
    fairness rule, extends)."""

    length_s: float = Field(gt=0)
    grace_s: float = Field(SLOT_GRACE_S, ge=0)
    kill_after_s: float = Field(SLOT_KILL_AFTER_S, ge=0)  # SIGKILL this long after the slot's SIGTERM
    extend_when_idle: bool = False

    @model_validator(mode="after")
    def _grace_inside(self) -> "SlotSpec":
        if self.grace_s >= self.length_s:
            raise ValueError(f"grace_s ({self.grace_s}) must be shorter than length_s ({self.length_s})")
        return self


class EmulationProfile(_Strict):
    """What the job really does on an emulated GPU (the truth the device enforces)."""

    peak_mib: float = Field(gt=0)
    duration_s: float = Field(gt=0)  # solo run time on an A100-40GB
    smact: float = Field(0.5, ge=0, le=1)
    smocc: float | None = Field(None, ge=0, le=1)  # default: derived from smact
    drama: float | None = Field(None, ge=0, le=1)
    warmup_s: float = Field(WARMUP_S, ge=0)  # time until the peak allocation is reached


class RetrySpec(_Strict):
    """Retries after failures that are not OOM (OOM has its own, stepwise recovery)."""

    max_retries: int = Field(0, ge=0, le=_INT_MAX)
    on_exit_codes: tuple[Int64, ...] | None = None  # None: any non-zero exit


class JobSpec(_Strict):
    """One training job. Field names are a public contract (see README)."""

    name: str = Field(min_length=1, max_length=200)
    command: tuple[str, ...] | None = None
    entrypoint: str | None = Field(None, pattern=r"^[\w.]+:[\w.]+$")
    gpus: int = Field(1, ge=1, le=_INT_MAX)
    gpus_per_node: int | None = Field(None, ge=1, le=_INT_MAX)
    memory_mib: float | None = Field(None, gt=0)  # declared need per GPU
    estimator: Literal[ESTIMATORS] = "auto"  # type: ignore[valid-type]  # the names of estimate_rules.RULES
    model: ModelSpec | None = None
    training: TrainingSpec | None = None  # an LLM's training set-up (``estimators.llm``)
    batch_size: int | None = Field(None, ge=1, le=_INT_MAX)
    priority: Int64 = 0
    slot: SlotSpec | None = None
    checkpoint_dir: str | None = None
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    runtime_env: Annotated[dict[str, Any], AfterValidator(check_runtime_env)] | None = None  # Ray's, for its processes
    emulation: EmulationProfile | None = None
    max_attempts: int = Field(4, ge=1, le=_INT_MAX)  # OOM recovery attempts in all, the first run included
    retry: RetrySpec = Field(default_factory=RetrySpec)
    user: str = "default"
    queue: str | None = Field(None, min_length=1, max_length=63)  # the team queue (quotas); None: ``default``
    priority_class: str | None = Field(None, min_length=1, max_length=63)  # its priority: the class's value
    # Whether a reclaim or a higher priority may preempt it (checkpoint first); None: as its priority
    # class and its queue say (``QuotaBook.preemptible``).
    preemptible: bool | None = None
    # The GPU types the job may run on, as glob patterns over ``gpu_types.GPU_TYPES``' names
    # (``["A100*"]``); None: any.
    gpu_types: Annotated[list[str], AfterValidator(check_gpu_type_patterns)] | None = None

    @field_validator("workdir", "checkpoint_dir")
    @classmethod
    def _a_path(cls, value: str | None) -> str | None:
        if value is not None and "\0" in value:
            raise ValueError("contains a NUL character (no path can)")
        return value

    @field_validator("env")
    @classmethod
    def _an_environment(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if problem := env_var_problem(name, value):
                raise ValueError(f"{_short(name)}: {problem}")
        return env

    @model_validator(mode="after")
    def _consistent(self) -> "JobSpec":
        if self.command is not None and len(self.command) == 0:
            raise ValueError("command must not be empty")
        if self.command is not None and self.entrypoint is not None:
            raise ValueError("give either command or entrypoint, not both")
        if self.gpus_per_node is not None and self.gpus % self.gpus_per_node:
            raise ValueError(
                f"gang shape: gpus ({self.gpus}) must be a multiple of gpus_per_node ({self.gpus_per_node})"
            )
        if self.preemptible and self.checkpoint_dir is None:
            raise ValueError("preemptible: true needs a checkpoint_dir (a preempted job resumes from its checkpoint)")
        if self.priority_class is not None and self.priority != 0:
            raise ValueError("give either priority or priority_class, not both")
        if self.estimator == "oracle" and self.emulation is None and self.memory_mib is None:
            raise ValueError("estimator 'oracle' needs emulation.peak_mib or memory_mib (the true need)")
        return self

    @property
    def nodes(self) -> int:
        """Number of nodes of the gang (1 for single-node jobs)."""
        return self.gpus // self.gpus_per_node if self.gpus_per_node else 1

    @property
    def per_node_gpus(self) -> int:
        return self.gpus_per_node or self.gpus

    @property
    def is_gang(self) -> bool:
        return self.nodes > 1

    @property
    def workload(self) -> str:
        """What the job runs, for "the same job" (``learning.job_signature``): its model factory or step, else
        its command or entrypoint, else its name; on emulated GPUs also its emulated truth."""
        if self.model is not None and (self.model.factory or self.model.step):
            workload = self.model.factory or f"step:{self.model.step}"
        else:
            workload = " ".join(self.command) if self.command else (self.entrypoint or self.name)
        if self.emulation is not None:
            workload += "|emulated:" + self.emulation.model_dump_json()
        return workload

    @property
    def training_batch(self) -> int | None:
        return (self.model.batch_size if self.model else None) or self.batch_size

    @property
    def data_parallel(self) -> bool:
        """A job on several GPUs is taken to train with DistributedDataParallel, the common case:
        each GPU also holds its gradient buckets. Other schemes (sharded, pipelined) declare
        ``memory_mib``."""
        return self.gpus > 1


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 3, 4, 4, 4, 4
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 60, 60, 40


def _short(value: Any) -> str:
    """``repr`` cut to a line: a bad value may be huge or deeply nested (a YAML alias bomb)."""
    return _REPR.repr(value)


def _location(part: Any) -> str:
    """One step of a field's path: a name or index as it is, anything else (``""``, ``"a.b"``, a
    key that is not a string, a name too long for a line) quoted and cut, so the path stays
    unambiguous and short."""
    if isinstance(part, int) or (isinstance(part, str) and len(part) <= 60 and re.fullmatch(r"[\w\[\]-]+", part)):
        return str(part)
    return _short(part)  # quoted, and a very long key cut like a value


def describe_error(err: dict[str, Any], model: type[BaseModel] | None = None) -> str:
    """One pydantic error as ``field.path: what is wrong (got value)`` (also the queue configuration's).
    With the ``model`` validated, an unknown field is told the fields it may have meant."""
    loc = ".".join(map(_location, err["loc"])) or "spec"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return f"{loc}: unknown field" + _known_fields_hint(model, err["loc"])
    if kind == "missing":
        return f"{loc}: required field missing"
    got = err.get("input")
    if kind.startswith(("greater_than", "less_than", "string_", "int_", "float_", "literal", "tuple", "list",
                        "finite_number")):
        return f"{loc}: {msg.lower()} (got {_short(got)})"
    return f"{loc}: {msg}"


def _known_fields_hint(model: type[BaseModel] | None, loc: Sequence[str | int]) -> str:
    """`` (did you mean memory_mib?)`` for a misspelt field, else the fields there, when few."""
    fields = _fields_at(model, loc[:-1]) if model is not None else []
    close = difflib.get_close_matches(str(loc[-1]), fields, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]}?)"
    return f" (the fields here: {', '.join(fields)})" if 0 < len(fields) <= 8 else ""


def _fields_at(model: type[BaseModel], path: Sequence[str | int]) -> list[str]:
    """The fields (as written in a spec) of the model found at ``path`` inside ``model``; list
    positions are passed over. [] where the path leads to no model."""
    for part in path:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        inner = _model_in(field.annotation) if field is not None else None
        if inner is None:
            return []
        model = inner
    return [info.alias or name for name, info in model.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field's type holds: itself, or inside ``X | None``, ``tuple[X, ...]``, ``Annotated``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for m in map(_model_in, get_args(annotation)) if m is not None), None)


def parse_spec(data: Mapping[str, Any], *, source: str = "job spec", callable_: Callable | None = None) -> JobSpec:
    """Validate a mapping into a ``JobSpec`` or raise ``SpecError`` naming each bad field."""
    if not isinstance(data, Mapping):
        raise SpecError([f"expected a mapping of fields, got {type(data).__name__}"], source)
    raw = dict(data)
    errors = _command_errors(raw.get("command"))
    if errors:  # (said in its own words; the other fields are still checked: every bad one named at once)
        del raw["command"]
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        errors += [describe_error(e, JobSpec) for e in exc.errors()]
    if errors:
        raise SpecError(errors, source) from None
    if spec.command is None and spec.entrypoint is None and callable_ is None and spec.emulation is None:
        raise SpecError(["command: give a command (argv), an entrypoint, or an emulation profile"], source)
    return spec


def _command_errors(command: Any) -> list[str]:
    """What is wrong with a spec's ``command`` (argv), in words pydantic's would not find."""
    if command is None:
        return []
    if isinstance(command, str):
        return ["command: must be a list of strings (argv), not one string"]
    if not isinstance(command, (list, tuple)):
        return [f"command: must be a list of strings (argv) (got {_short(command)})"]
    bad = [a for a in command if not isinstance(a, str)]
    if bad:
        return [f"command: every argument must be a string (got {_short(bad[0])})"]
    if any("\0" in a for a in command):
        return ["command: an argument contains a NUL character"]
    return []


def check_fits(spec: JobSpec, admission: AdmissionIndex, need_mib: float | None = None, *,
               needs: Sequence[tuple[str, float]] = ()) -> None:
    """Reject a spec no node of the cluster can ever hold (``AdmissionIndex.problems``' rule).

    ``need_mib`` is the per-GPU memory the scheduler will reserve (estimate), ``needs`` the
    same per GPU type where it differs; when given, at least ``per_node_gpus`` GPUs of one node
    of a type the spec allows (``gpu_types``) must each hold the need on that type.
    """
    field = "gpus_per_node" if spec.gpus_per_node else "gpus"
    problems = admission.problems(spec.per_node_gpus, spec.nodes, need_mib, needs=needs,
                                  gpu_types=tuple(spec.gpu_types or ()), per_node_field=field)
    if problems:
        raise SpecError(problems, f"job spec {spec.name!r}")


def ticket_for_spec(job_id: str, spec: JobSpec, belief: Belief) -> JobTicket:
    """The live queue's ticket for a validated spec (``tickets.make_ticket``)."""
    slot = spec.slot
    return make_ticket(
        job_id, spec.name, workload=spec.workload, batch_size=spec.training_batch, gpus=spec.gpus,
        gpus_per_node=spec.gpus_per_node, belief=belief, priority=spec.priority,
        slot=Slot(slot.length_s, slot.grace_s, slot.kill_after_s, slot.extend_when_idle) if slot else None,
        max_attempts=spec.max_attempts, max_retries=spec.retry.max_retries, retry_exit_codes=spec.retry.on_exit_codes,
        queue=spec.queue, checkpoints=spec.checkpoint_dir is not None, user=spec.user,
        priority_class=spec.priority_class, preemptible=spec.preemptible,
        gpu_types=tuple(spec.gpu_types or ()),
    )
