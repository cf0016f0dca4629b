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
#   validate     the cost model against one GPU: scripts/validate_step_cost.py under
#                torchrun, one rank, NCCL, gpt-small (the GPU's measured profile, then each
#                step predicted and measured, and the host's time to issue it)
#                                                                 -> validate_world1.txt/.json
#   host         scripts/profile_step.py --host, one rank, NCCL: the host's side of
#                gpt-small's step at 64 and 4 MiB buckets, and of the "24 shapes"
#                fixed-cost step as it is and with every side 16 times as long (the
#                same parameters and buckets, larger tensors): self time per op, kernel
#                launches per step, each in a process of its own -> host.txt
#   bench        scripts/bench_single_device.py on CUDA (CUDA-event times): gpt-small and
#                llama-1b, arms eager torch.optim.Muon, muon, bmm roofline
#                                                                 -> bench_single.txt/.json
#   tests        the CUDA instances of the device-parametrised tests (pytest -m cuda, 4
#                workers)                                         -> tests.log, junit.xml
#   memory       the step's peak memory against the planner's estimate:
#                scripts/measure_step_memory.py, one rank, NCCL  -> memory_world1.txt
#   distributed  with 2 or more GPUs: scripts/bench_distributed.py under torchrun, NCCL
#                                                                 -> bench_distributed.txt
# and prints a short table last (also summary.txt). On one H100 (2026-11-26) validate took
# 5.6 min (before the ten fixed-cost steps were compiled again to be timed with the steps,
# the default since 2026-11-27: an estimated 8 min now; VALIDATE_ARGS with
# --no-fixed-costs-during-steps skips them), tests about 3, bench 2-4 per workload, most
# of it compiling: where one command may run 10 minutes, split the steps over several
# (`... DIR validate`, `... DIR bench`).
# GPU_CHECK_STEP_SECONDS bounds each step (default 0: unbounded); BENCH_SINGLE_ARGS
# replaces the benchmark's workload and arms (e.g. "--workload all" for every workload
# and arm), VALIDATE_ARGS the validation's, BENCH_DIST_ARGS adds to the distributed one's.
# Exit status: non-zero when a step failed (the later steps still run).
set -uo pipefail
KNOWN=(validate host bench tests memory distributed)
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
  # two leases of one kind issued the same step 1.7x apart: the host's CPU may differ
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

if wanted validate; then
  step "cost model against one GPU, torchrun with one rank, NCCL"
  # shellcheck disable=SC2086
  bounded "$PY" -m torch.distributed.run --nproc-per-node 1 scripts/validate_step_cost.py --backend nccl \
    ${VALIDATE_ARGS:---workload gpt-small --instances 1 --reps 10 --profile-reps 5 --split-steps 0} \
    --save "$REPORT/validate_world1.json" > "$REPORT/validate_world1.txt" 2> "$REPORT/validate_world1.log" || status=1
  tail -4 "$REPORT/validate_world1.txt" >&2
fi

if wanted host; then
  step "the host's side of four steps, torchrun with one rank, NCCL"
  : > "$REPORT/host.txt"
  for config in "gpt-small|64|1" "gpt-small|4|1" "24 shapes|64|1" "24 shapes|64|16"; do
    IFS='|' read -r workload mb scale <<< "$config"
    bounded "$PY" -m torch.distributed.run --nproc-per-node 1 scripts/profile_step.py --backend nccl \
      --workload "$workload" --bucket-mb "$mb" --scale "$scale" --host --rows 40 >> "$REPORT/host.txt" 2>> "$REPORT/host.log" || status=1
  done
  grep "^host: " "$REPORT/host.txt" >&2
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

if wanted memory; then
  step "peak memory against the planner's estimate, torchrun with one rank, NCCL"
  bounded "$PY" -m torch.distributed.run --nproc-per-node 1 scripts/measure_step_memory.py --backend nccl \
    > "$REPORT/memory_world1.txt" 2> "$REPORT/memory_world1.log" || status=1
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
