#!/usr/bin/env bash
# The project's entry points. Each (re)creates .venv/ and installs hier-sched into it first.
#   ./run.sh demo         a local Ray cluster with emulated GPUs replays a real trace and prints the result
#   ./run.sh test         the whole test suite (.venv, CPU build of torch), then the estimator tests again
#                         under the CUDA build of torch that GPU users install, and the checkpoint callbacks
#                         of the trainers (Hugging Face, Lightning) that only that venv has (see test-cuda)
#   ./run.sh test ARGS    pytest ARGS in .venv only (e.g. one file, -k, --co)
#   ./run.sh test-cuda [ARGS]
#                         those tests (or pytest ARGS) in a second, cached venv with the CUDA build of
#                         torch, timm, transformers and lightning: the trace path must work there too (a CUDA
#                         build starts autograd threads that a forked child cannot use). Created on
#                         first use under ~/.cache/hier_sched (~6 GB, a few minutes); reused while the
#                         pins below and pyproject.toml are unchanged.
#   ./run.sh cuda-cli ARGS
#                         `hier-sched ARGS` of this checkout in that venv (e.g. estimators coverage, which
#                         needs timm or transformers)
set -euo pipefail
cd "$(dirname "$0")"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"   # see FIELD_NOTES: a stray ~/.ray/auth_token breaks local clusters

# What a GPU user installs (the CUDA build runs on a CPU-only machine too), plus the model
# libraries the field tests build architectures from (configs only, never weights) and the
# trainers the checkpoint callbacks plug into (accelerate: what transformers' Trainer needs), and PEFT,
# whose DoRA and IA3 the training section's estimate is checked against.
CUDA_PINS="torch==2.14.1 torchvision==0.29.1 timm==1.0.29 transformers==5.17.0 accelerate==1.15.0 lightning==2.6.6
  peft==0.21.2"
# The estimator tests that run under both builds of torch, and the trainers' callbacks (skipped in .venv).
CUDA_TESTS="tests/estimators/test_estimators_trace.py tests/estimators/test_estimators_field.py
  tests/estimators/test_estimators_user_step.py tests/estimators/test_estimators_llm.py
  tests/estimators/test_estimators_job_estimate.py::test_a_training_section_is_estimated_per_gpu_type_with_its_parts
  tests/common/test_hf_checkpoint.py tests/common/test_lightning_checkpoint.py"

quiet_pip() {
  # pip warns once per package about this machine's missing local mirrors; keep the real errors.
  local pip=$1; shift
  "$pip" install -q "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

setup() {
  [ -x .venv/bin/python ] || python3 -m venv .venv
  local stamp=.venv/.hier-sched-installed
  local want; want=$(cat pyproject.toml | sha1sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setting up .venv (first run takes a few minutes) ..." >&2
    # The CPU build of torch first: a looser requirement would pull a multi-GB CUDA build.
    quiet_pip .venv/bin/pip torch==2.13.0 || quiet_pip .venv/bin/pip "torch>=2.4"
    quiet_pip .venv/bin/pip -e '.[dev]'
    echo "$want" > "$stamp"
  fi
}

# The CUDA-build venv holds the pins and the project's dependencies, not the project itself: the tests
# import the checkout through PYTHONPATH, so one cached venv serves every checkout. Built in a temporary
# folder and renamed when complete, under a lock, so concurrent runs never see half a venv.
cuda_venv() {
  local cache="${HIER_SCHED_CACHE:-$HOME/.cache/hier_sched}"
  local key; key=$( (echo "$CUDA_PINS"; cat pyproject.toml) | sha1sum | cut -c1-12)
  CUDA_VENV="$cache/venv-cuda-$key"
  mkdir -p "$cache"
  exec 9>"$cache/venv-cuda.lock"
  flock 9
  if [ ! -x "$CUDA_VENV/bin/python" ]; then
    echo "setting up $CUDA_VENV (CUDA build of torch, ~6 GB, a few minutes; once) ..." >&2
    local tmp="$CUDA_VENV.building"
    rm -rf "$tmp"   # a half-built one
    # venvs of other pins unused for a week (each is ~6 GB)
    find "$cache" -maxdepth 1 -name 'venv-cuda-*' -type d -mtime +7 -exec rm -rf {} +
    # Explicit checks, not set -e: this runs inside `... || status=$?`, where bash ignores set -e,
    # and a venv whose install failed must never be renamed into place.
    python3 -m venv "$tmp" || { flock -u 9; return 1; }
    # the pins and the project's dependencies (pyproject.toml: dependencies + the dev extra), pins kept
    local deps
    read -r -a deps <<< "$("$tmp/bin/python" -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print(" ".join(p["dependencies"] + p["optional-dependencies"]["dev"]))')"
    # shellcheck disable=SC2086  # CUDA_PINS is a list of requirements
    if [ ${#deps[@]} -eq 0 ] || ! quiet_pip "$tmp/bin/pip" $CUDA_PINS "${deps[@]}"; then
      echo "setting up $CUDA_VENV failed" >&2; flock -u 9; return 1
    fi
    # venv scripts name their folder in their #! line; the venv is only used through bin/python.
    mv "$tmp" "$CUDA_VENV"
  fi
  touch "$CUDA_VENV"   # marks it used (see the clean-up above)
  flock -u 9
}

run_cuda_tests() {
  cuda_venv || return 1
  echo "== tests under the CUDA build of torch ($CUDA_VENV)" >&2
  # HIER_SCHED_FIELD_LIBS=required: a missing timm/transformers/lightning fails their tests instead of skipping them.
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HIER_SCHED_FIELD_LIBS=required \
    "$CUDA_VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
}

case "${1:-}" in
  demo) setup; shift; exec .venv/bin/hier-sched demo "$@" ;;
  test)
    setup; shift
    if [ $# -gt 0 ]; then exec .venv/bin/python -m pytest -q "$@"; fi
    status=0
    .venv/bin/python -m pytest -q || status=$?
    # shellcheck disable=SC2086  # CUDA_TESTS is a list of paths
    run_cuda_tests $CUDA_TESTS || status=$?
    exit $status ;;
  test-cuda)
    shift
    # shellcheck disable=SC2086
    if [ $# -gt 0 ]; then run_cuda_tests "$@"; else run_cuda_tests $CUDA_TESTS; fi ;;
  cuda-cli)
    shift; cuda_venv || exit 1
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "$CUDA_VENV/bin/python" -c \
      'import sys; from hier_sched.front.cli import main; sys.argv[0] = "hier-sched"; main()' "$@" ;;
  *) echo "usage: ./run.sh demo | ./run.sh test [PYTEST ARGS] | ./run.sh test-cuda [PYTEST ARGS] | ./run.sh cuda-cli ARGS" >&2
     exit 2 ;;
esac
