#!/usr/bin/env bash
# The project's two entry points. Each (re)creates .venv/ and installs hier-sched into it first.
#   ./run.sh demo   a local Ray cluster with emulated GPUs replays a real trace and prints the result
#   ./run.sh test   the whole test suite
set -euo pipefail
cd "$(dirname "$0")"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"   # see FIELD_NOTES: a stray ~/.ray/auth_token breaks local clusters

pip_install() {
  # pip warns once per package about this machine's missing local mirrors; keep the real errors.
  .venv/bin/pip install -q "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

setup() {
  [ -x .venv/bin/python ] || python3 -m venv .venv
  local stamp=.venv/.hier-sched-installed
  local want; want=$(cat pyproject.toml | sha1sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setting up .venv (first run takes a few minutes) ..." >&2
    # The CPU build of torch first: a looser requirement would pull a multi-GB CUDA build.
    pip_install torch==2.13.0 || pip_install "torch>=2.4"
    pip_install -e '.[dev]'
    echo "$want" > "$stamp"
  fi
}

case "${1:-}" in
  demo) setup; shift; exec .venv/bin/hier-sched demo "$@" ;;
  test) setup; shift; exec .venv/bin/python -m pytest -q "$@" ;;
  *) echo "usage: ./run.sh demo | ./run.sh test" >&2; exit 2 ;;
esac
