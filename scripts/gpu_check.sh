#!/usr/bin/env bash
# One command on a GPU machine:   bash scripts/gpu_check.sh REPORT_DIR
#
# Needs a Python whose torch is a CUDA build (python3, or $PYTHON) with pytest and
# pytest-timeout; no network. Steps, each logged to REPORT_DIR:
#   1. environment: nvidia-smi, torch, CUDA, GPU count            -> environment.txt
#   2. this package installed into that Python, no dependency resolution, no index
#                                                                 -> install.log
#   3. the CUDA instances of the device-parametrised tests (pytest -m cuda)
#                                                                 -> tests.log, junit.xml
#   4. scripts/bench_single_device.py on CUDA (CUDA-event times, every arm incl. the
#      bmm roofline and the default backend)                      -> bench_single.txt/.json
#   5. with 2 or more GPUs: scripts/bench_distributed.py under torchrun with NCCL
#                                                                 -> bench_distributed.txt
#   6. the cost model against one GPU: scripts/validate_step_cost.py under torchrun, one
#      rank, NCCL (the GPU's measured profile, then each step predicted and measured)
#                                                                 -> validate_world1.txt/.json
#   7. the step's peak memory against the planner's estimate: scripts/measure_step_memory.py,
#      one rank, NCCL (max_memory_allocated)                      -> memory_world1.txt
# and prints a short table last (also summary.txt). Extra benchmark arguments:
# BENCH_SINGLE_ARGS (e.g. "--workload gpt-small --reps 5"), BENCH_DIST_ARGS.
# Exit status: non-zero when a step failed (the later steps still run).
set -uo pipefail
if [ $# -ne 1 ]; then
  echo "usage: bash scripts/gpu_check.sh REPORT_DIR" >&2
  exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$1"
REPORT="$(cd "$1" && pwd)"
PY="${PYTHON:-python3}"
cd "$ROOT"
export PYTHONUNBUFFERED=1
status=0
step() { echo "=== $* ===" >&2; }

step "environment"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'torch ' + torch.__version__ + ': torch.cuda.is_available() is False')"; then
  echo "gpu_check: $PY has no usable CUDA torch (see above; PYTHON=... picks another interpreter)" >&2
  exit 1
fi
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count(), torch.cuda.get_device_name())"
  nvidia-smi 2>&1 || true
} > "$REPORT/environment.txt"
GPUS="$("$PY" -c "import torch; print(torch.cuda.device_count())")"
cat "$REPORT/environment.txt" >&2

step "install (no dependencies, no index)"
if ! "$PY" -m pip install --no-deps --no-build-isolation --no-index -e "$ROOT" > "$REPORT/install.log" 2>&1; then
  echo "gpu_check: installing the package failed, see $REPORT/install.log" >&2
  tail -5 "$REPORT/install.log" >&2
  exit 1
fi

step "CUDA tests (pytest -m cuda)"
"$PY" -m pytest -m cuda -q -p no:cacheprovider --junitxml="$REPORT/junit.xml" tests > "$REPORT/tests.log" 2>&1 || status=1
tail -3 "$REPORT/tests.log" >&2

step "single-device benchmark on CUDA"
# shellcheck disable=SC2086
"$PY" scripts/bench_single_device.py --device cuda --json "$REPORT/bench_single.json" ${BENCH_SINGLE_ARGS:-} \
  > "$REPORT/bench_single.txt" 2> "$REPORT/bench_single.log" || status=1

if [ "$GPUS" -ge 2 ]; then
  step "distributed benchmark, torchrun on $GPUS GPUs, NCCL"
  # shellcheck disable=SC2086
  "$PY" -m torch.distributed.run --nproc-per-node "$GPUS" scripts/bench_distributed.py --backend nccl ${BENCH_DIST_ARGS:-} \
    > "$REPORT/bench_distributed.txt" 2> "$REPORT/bench_distributed.log" || status=1
else
  echo "one GPU: the distributed benchmark needs 2 or more (skipped)" | tee "$REPORT/bench_distributed.txt" >&2
fi

step "cost model against one GPU, torchrun with one rank, NCCL"
"$PY" -m torch.distributed.run --nproc-per-node 1 scripts/validate_step_cost.py --backend nccl \
  --save "$REPORT/validate_world1.json" > "$REPORT/validate_world1.txt" 2> "$REPORT/validate_world1.log" || status=1
tail -4 "$REPORT/validate_world1.txt" >&2

step "peak memory against the planner's estimate, torchrun with one rank, NCCL"
"$PY" -m torch.distributed.run --nproc-per-node 1 scripts/measure_step_memory.py --backend nccl \
  > "$REPORT/memory_world1.txt" 2> "$REPORT/memory_world1.log" || status=1

"$PY" scripts/gpu_summary.py "$REPORT" | tee "$REPORT/summary.txt"
exit $status
