"""The job spec: what a user submits, validated before anything is queued.

Validation uses pydantic (field-named errors for free); ``SpecError`` turns its report into one
readable message per problem, e.g. ``gpus: must be >= 1 (got 0)``. Specs load from YAML,
TOML, JSON or a dict. ``check_fits`` rejects a spec no node of a given cluster can ever hold.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from hier_sched.core.admission import admission_problems
from hier_sched.core.gpu_model import WARMUP_S
from hier_sched.core.learning import job_signature
from hier_sched.core.runtime_env import check_runtime_env

__all__ = [
    "SpecError",
    "ModelSpec",
    "SlotSpec",
    "EmulationProfile",
    "RetrySpec",
    "JobSpec",
    "ESTIMATORS",
    "load_spec",
    "parse_spec",
    "check_fits",
]

ESTIMATORS = ("auto", "horus", "faketensor", "ml", "gpumemnet", "none", "oracle")


class SpecError(ValueError):
    """A job spec that cannot be accepted; the message names every offending field."""

    def __init__(self, problems: Sequence[str], source: str = "job spec"):
        self.problems = list(problems)
        self.source = source
        super().__init__(f"invalid {source}: " + "; ".join(self.problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ModelSpec(_Strict):
    """What the estimators need to know about the model."""

    factory: str | None = Field(None, pattern=r"^[\w.]+:[\w.]+$")  # "pkg.mod:build"
    batch_size: int | None = Field(None, ge=1)
    input_shape: tuple[int, ...] | None = None
    optimizer: str = "adam"
    dtype: str = "float32"
    kind: Literal["mlp", "cnn", "transformer"] | None = None
    summary: str | None = None  # a torchsummary text file, for the feature-based estimator

    @model_validator(mode="after")
    def _shape_positive(self) -> "ModelSpec":
        if self.input_shape is not None and any(d < 1 for d in self.input_shape):
            raise ValueError(f"input_shape dimensions must be >= 1 (got {list(self.input_shape)})")
        return self


class SlotSpec(_Strict):
    """A fixed time slot: after ``length_s`` the job yields its GPUs; ``grace_s`` before that it
    receives the checkpoint signal, saves, exits with the requeue code and is resumed later.
    ``extend_when_idle``: when no job waits at the slot's end, keep running for another slot
    instead (a job's own slot is a hard slot unless it says so; the cluster's default slot, a
    fairness rule, extends)."""

    length_s: float = Field(gt=0)
    grace_s: float = Field(600.0, ge=0)
    kill_after_s: float = Field(30.0, ge=0)  # SIGKILL this long after the slot's SIGTERM
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

    max_retries: int = Field(0, ge=0)
    on_exit_codes: tuple[int, ...] | None = None  # None: any non-zero exit


class JobSpec(_Strict):
    """One training job. Field names are a public contract (see README)."""

    name: str = Field(min_length=1, max_length=200)
    command: tuple[str, ...] | None = None
    entrypoint: str | None = Field(None, pattern=r"^[\w.]+:[\w.]+$")
    gpus: int = Field(1, ge=1)
    gpus_per_node: int | None = Field(None, ge=1)
    memory_mib: float | None = Field(None, gt=0)  # declared need per GPU
    estimator: Literal["auto", "horus", "faketensor", "ml", "gpumemnet", "none", "oracle"] = "auto"
    model: ModelSpec | None = None
    batch_size: int | None = Field(None, ge=1)
    priority: int = 0
    slot: SlotSpec | None = None
    checkpoint_dir: str | None = None
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    runtime_env: Annotated[dict[str, Any], AfterValidator(check_runtime_env)] | None = None  # Ray's, for its processes
    emulation: EmulationProfile | None = None
    max_attempts: int = Field(4, ge=1)  # OOM recovery attempts in all, the first run included
    retry: RetrySpec = Field(default_factory=RetrySpec)
    user: str = "default"

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

    def signature(self, gpu_type: str) -> str:
        """"The same job" for learning its peak and run time (``learning.job_signature``): what it
        runs (model factory, else command or entrypoint, else name; on emulated GPUs also its
        emulated truth), its batch and its GPUs."""
        if self.model is not None and self.model.factory:
            workload = self.model.factory
        else:
            workload = " ".join(self.command) if self.command else (self.entrypoint or self.name)
        if self.emulation is not None:
            workload += "|emulated:" + self.emulation.model_dump_json()
        batch = (self.model.batch_size if self.model else None) or self.batch_size
        return job_signature(workload, batch, self.gpus, gpu_type)

    @property
    def data_parallel(self) -> bool:
        """A job on several GPUs is taken to train with DistributedDataParallel, the common case:
        each GPU also holds its gradient buckets. Other schemes (sharded, pipelined) declare
        ``memory_mib``."""
        return self.gpus > 1


def _describe(err: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in err["loc"]) or "spec"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return f"{loc}: unknown field"
    if kind == "missing":
        return f"{loc}: required field missing"
    got = err.get("input")
    if kind.startswith(("greater_than", "less_than", "string_", "int_", "float_", "literal", "tuple", "list")):
        return f"{loc}: {msg.lower()} (got {got!r})"
    return f"{loc}: {msg}"


def parse_spec(data: Mapping[str, Any], *, source: str = "job spec", callable_: Callable | None = None) -> JobSpec:
    """Validate a mapping into a ``JobSpec`` or raise ``SpecError`` naming each bad field."""
    if not isinstance(data, Mapping):
        raise SpecError([f"expected a mapping of fields, got {type(data).__name__}"], source)
    raw = dict(data)
    command = raw.get("command")
    if isinstance(command, str):
        raise SpecError(["command: must be a list of strings (argv), not one string"], source)
    if isinstance(command, (list, tuple)) and not all(isinstance(a, str) for a in command):
        bad = [a for a in command if not isinstance(a, str)]
        raise SpecError([f"command: every argument must be a string (got {bad[0]!r})"], source)
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError([_describe(e) for e in exc.errors()], source) from None
    if spec.command is None and spec.entrypoint is None and callable_ is None and spec.emulation is None:
        raise SpecError(["command: give a command (argv), an entrypoint, or an emulation profile"], source)
    return spec


def load_spec(path: str | Path) -> JobSpec:
    """Load a spec file (.yaml/.yml, .toml or .json)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError([f"cannot read file: {exc.strerror or exc}"], str(p)) from None
    try:
        if p.suffix == ".toml":
            data = tomllib.loads(text)
        elif p.suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise SpecError([f"not valid {p.suffix.lstrip('.') or 'YAML'}: {exc}"], str(p)) from None
    return parse_spec(data if data is not None else {}, source=str(p))


def check_fits(spec: JobSpec, nodes: Mapping[str, Sequence[float]], need_mib: float | None = None) -> None:
    """Reject a spec no node of the cluster can ever hold (``admission_problems``' rule).

    ``nodes`` maps node name -> per-GPU memory totals (MiB). ``need_mib`` is the per-GPU memory
    the scheduler will reserve (estimate); when given, at least ``per_node_gpus`` GPUs of one
    node must each be that big.
    """
    field = "gpus_per_node" if spec.gpus_per_node else "gpus"
    problems = admission_problems(spec.per_node_gpus, spec.nodes, need_mib, nodes, per_node_field=field)
    if problems:
        raise SpecError(problems, f"job spec {spec.name!r}")
