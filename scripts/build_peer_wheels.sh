#!/usr/bin/env bash
# The peers' wheels for scripts/gpu_check.sh, built on a machine with a package registry (the GPU
# machines reach none) and carried to the GPU machine with the working tree:
#
#   bash scripts/build_peer_wheels.sh EMERGING_GIT DION_GIT [OUT_DIR]
#
# EMERGING_GIT, DION_GIT: git directories (a clone, or a bare snapshot such as the one the
# `fetch` tool brings) of github.com/NVIDIA-NeMo/Emerging-Optimizers and github.com/microsoft/dion;
# their HEAD is built (pip wheel, no dependencies). OUT_DIR defaults to vendor/wheels (ignored by
# git: `carry` it). HeavyBall and the peers' dependencies that the GPU image lacks (absl-py,
# opt_einsum) are downloaded as wheels for the GPU machines' Python (GPU_PYTHON_VERSION, default
# 3.12). Prints what it built; exits non-zero when a wheel could not be made.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash scripts/build_peer_wheels.sh EMERGING_GIT DION_GIT [OUT_DIR]" >&2
  exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${3:-$ROOT/vendor/wheels}"
PYVER="${GPU_PYTHON_VERSION:-3.12}"
PY="${PYTHON:-python3}"
HEAVYBALL="heavyball==3.2.1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

# a pure-Python package from a git directory's HEAD (Emerging-Optimizers asks for Python 3.12,
# the GPU machines' own: the wheel is built here by another Python, hence --ignore-requires-python)
from_git() {
  local name="$1" git_dir="$2"
  local commit
  commit="$(git --git-dir "$git_dir" rev-parse --short HEAD 2> /dev/null || git -C "$git_dir" rev-parse --short HEAD)"
  mkdir -p "$WORK/$name"
  if [ -d "$git_dir/.git" ]; then git_dir="$git_dir/.git"; fi
  git --git-dir "$git_dir" archive HEAD | tar -x -C "$WORK/$name"
  "$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps --ignore-requires-python \
    -w "$OUT" "$WORK/$name"
  echo "$name: built from commit $commit"
}

from_git emerging-optimizers "$1"
from_git dion "$2"
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$PYVER" --dest "$OUT" "$HEAVYBALL" opt_einsum absl-py
echo "downloaded for Python $PYVER: $HEAVYBALL, opt_einsum, absl-py"
ls -1 "$OUT"
