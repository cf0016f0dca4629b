#!/usr/bin/env bash
# One command on a GPU machine:   bash scripts/gpu_check.sh REPORT_DIR [STEP ...]
#
# Needs a Python whose torch is a CUDA build (python3, or $PYTHON) with pytest,
# pytest-timeout and pytest-xdist; no network. Steps, each logged to REPORT_DIR (STEP
# names a subset, in this order; default all):
#   environment  the host's CPU model, nvidia-smi, torch, CUDA, GPU count (always)
#                                                                 -> environment.txt
#   install      this package into that Python, no dependency resolution, no index (always)
#                                                                 -> install.log
#   bench        scripts/bench_single_device.py on CUDA (CUDA-event times): gpt-small and
#                llama-1b, arms eager torch.optim.Muon, muon, bmm roofline
#                                                                 -> bench_single.txt/.json
#   tests        the CUDA instances of the device-parametrised tests (pytest -m cuda, 4
#                workers)                                         -> tests.log, junit.xml
#   calibrate    the planner's profile of this GPU (python -m muon_compile.planner.calibrate:
#                its matmul rates and memory bandwidth)           -> profile.json, calibrate.txt
#   distributed  with 2 or more GPUs: scripts/bench_distributed.py under torchrun, NCCL
#                                                                 -> bench_distributed.txt
# and prints a short table last (scripts/gpu_summary.py; also summary.txt). On one H100
# tests took about 3 min, bench 2-4 per workload, most of it compiling: where one command
# may run 10 minutes, split the steps over several (`... DIR bench`, `... DIR tests`).
# GPU_CHECK_STEP_SECONDS bounds each step (default 0: unbounded); BENCH_SINGLE_ARGS
# replaces the benchmark's workload and arms (e.g. "--workload all" for every workload
# and arm), BENCH_DIST_ARGS adds to the distributed one's.
# Exit status: non-zero when a step failed (the later steps still run).
set -uo pipefail
KNOWN=(bench tests calibrate distributed)
if [ $# -lt 1 ]; then
  echo "usage: bash scripts/gpu_check.sh REPORT_DIR [${KNOWN[*]} ...]" >&2
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
STEPS=("${@:2}")
[ ${#STEPS[@]} -eq 0 ] && STEPS=("${KNOWN[@]}")
for name in "${STEPS[@]}"; do
  if [[ " ${KNOWN[*]} " != *" $name "* ]]; then
    echo "gpu_check: unknown step '$name' (known: ${KNOWN[*]})" >&2
    exit 2
  fi
done
wanted() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }
bounded() { if [ "${GPU_CHECK_STEP_SECONDS:-0}" -gt 0 ]; then timeout "$GPU_CHECK_STEP_SECONDS" "$@"; else "$@"; fi; }

step "environment"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'torch ' + torch.__version__ + ': torch.cuda.is_available() is False')"; then
  echo "gpu_check: $PY has no usable CUDA torch (see above; PYTHON=... picks another interpreter)" >&2
  exit 1
fi
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  # the host's CPU too: machines with the same GPU have issued the same step 1.7x apart
  echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cpus"
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

if wanted bench; then
  step "single-device benchmark on CUDA"
  # shellcheck disable=SC2086
  bounded "$PY" scripts/bench_single_device.py --device cuda --json "$REPORT/bench_single.json" \
    ${BENCH_SINGLE_ARGS:---workload gpt-small,llama-1b --arms eager-torch,muon,roofline --reps 5} \
    > "$REPORT/bench_single.txt" 2> "$REPORT/bench_single.log" || status=1
fi

if wanted tests; then
  step "CUDA tests (pytest -m cuda)"
  bounded "$PY" -m pytest -m cuda -q -p no:cacheprovider -n 4 --junitxml="$REPORT/junit.xml" tests \
    > "$REPORT/tests.log" 2>&1 || status=1
  tail -3 "$REPORT/tests.log" >&2
fi

if wanted calibrate; then
  step "calibrate: the planner's profile of this GPU"
  bounded "$PY" -m muon_compile.planner.calibrate --device cuda --out "$REPORT/profile.json" \
    > "$REPORT/calibrate.txt" 2>&1 || status=1
  tail -3 "$REPORT/calibrate.txt" >&2
fi

if wanted distributed; then
  if [ "$GPUS" -ge 2 ]; then
    step "distributed benchmark, torchrun on $GPUS GPUs, NCCL"
    # shellcheck disable=SC2086
    bounded "$PY" -m torch.distributed.run --nproc-per-node "$GPUS" scripts/bench_distributed.py --backend nccl ${BENCH_DIST_ARGS:-} \
      > "$REPORT/bench_distributed.txt" 2> "$REPORT/bench_distributed.log" || status=1
  else
    echo "one GPU: the distributed benchmark needs 2 or more (skipped)" | tee "$REPORT/bench_distributed.txt" >&2
  fi
fi

"$PY" scripts/gpu_summary.py "$REPORT" | tee "$REPORT/summary.txt"
exit $status
