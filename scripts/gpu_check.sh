#!/usr/bin/env bash
# One command on a GPU machine:   bash scripts/gpu_check.sh [--device cpu] REPORT_DIR [STEP ...]
#
# Needs a Python whose torch is a CUDA build (python3, or $PYTHON) with pytest,
# pytest-timeout and pytest-xdist; no network. --device cpu runs the same steps on the CPU
# with a tiny workload, compiling in the caller's Inductor cache (what tests/scripts/test_gpu_check.py
# does: the script cannot fail on a GPU for a missing file or a typo). Steps, each logged to REPORT_DIR (STEP names a subset, in
# this order; default all):
#   environment  the host's CPU model, nvidia-smi, torch, CUDA, GPU count (always)
#                                                                 -> environment.txt
#   install      this package into that Python, no dependency resolution, no index, unless
#                it imports from this tree already; the peers' wheels of vendor/wheels/ where
#                that folder exists (built on a machine with a registry, carried here: see
#                docs/benchmarks.md, "Peers") (always)                -> install.log
#   bench        scripts/bench_single_device.py (CUDA-event times), every compiled arm
#                compiled first, in parallel processes: gpt-small, dense-1b and 4 layers of
#                Llama 3 8B; arms eager torch.optim.Muon, the default backend, muon, muon
#                with the CUDA graph, muon with symmetric products, unmodified
#                torch.optim.Muon under muon, the textbook roofline and the roofline of
#                the products chosen, and the peers -> bench_single.txt/.json,
#                and the muon arm's profiled step per workload -> traces/<workload>-muon.json
#   sym          scripts/bench_sym.py: the symmetric product kernel against bmm, m 256-8192,
#                X Xᵀ and S S in bf16                             -> bench_sym.txt/.json
#   epilogue     scripts/bench_epilogue.py: the textbook iteration's scalars in the products'
#                epilogues against one pointwise kernel, m 128-4096, bf16 and fp32 (the table
#                of matmul_rates' epilogue field)                 -> bench_epilogue.txt/.json
#   orientation  scripts/bench_epilogue.py --compare orientation: tall matrices iterated in
#                their own layout against transposed, m 128-4096, bf16 and fp32 (the table
#                of matmul_rates' orientation field)          -> bench_orientation.txt/.json
#   write        scripts/bench_write.py: the stacks' one-pass write kernel against the
#                foreach write it replaced, Llama 3.2 1B and 8B stacks -> bench_write.txt/.json
#   tests        the CUDA instances of the device-parametrised tests (pytest -m cuda, 4
#                workers)                                         -> tests.log, junit.xml
#   calibrate    the advisor's profile of this GPU (python -m muon_compile.advisor.calibrate:
#                its matmul rates and memory bandwidth)           -> profile.json, calibrate.txt
#   distributed  with 2 or more GPUs: scripts/bench_distributed.py under torchrun, NCCL
#                                                                 -> bench_distributed.txt
# and prints a short table last (scripts/gpu_summary.py; also summary.txt). On one H100
# tests took about 3 min, bench 2-4 per workload, most of it compiling: where one command
# may run 10 minutes, split the steps over several (`... DIR bench`, `... DIR tests`).
# GPU_CHECK_WHEELS names another folder of peer wheels (default vendor/wheels).
# GPU_CHECK_STEP_SECONDS bounds each step (default 0: unbounded); BENCH_SINGLE_ARGS
# replaces the benchmark's workload and arms (e.g. "--workload all" for every workload
# and arm), BENCH_DIST_ARGS adds to the distributed one's.
# Exit status: non-zero when a step failed (the later steps still run).
set -uo pipefail
KNOWN=(bench sym epilogue orientation write tests calibrate distributed)
DEVICE=cuda
if [ "${1:-}" = "--device" ]; then
  DEVICE="${2:-}"
  shift 2
fi
if [ $# -lt 1 ] || [[ "$DEVICE" != cuda && "$DEVICE" != cpu ]]; then
  echo "usage: bash scripts/gpu_check.sh [--device cpu] REPORT_DIR [${KNOWN[*]} ...]" >&2
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
if [ "$DEVICE" = cuda ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'torch ' + torch.__version__ + ': torch.cuda.is_available() is False')"; then
  echo "gpu_check: $PY has no usable CUDA torch (see above; PYTHON=... picks another interpreter)" >&2
  exit 1
fi
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  # the host's CPU too: machines with the same GPU have issued the same step 1.7x apart
  echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cpus"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
  nvidia-smi 2>&1 || true
} > "$REPORT/environment.txt"
GPUS="$("$PY" -c "import torch; print(torch.cuda.device_count())")"
cat "$REPORT/environment.txt" >&2

step "install (no dependencies, no index)"
: > "$REPORT/install.log"
if "$PY" -c "import muon_compile, sys; sys.exit(0 if muon_compile.__file__.startswith('$ROOT/') else 1)" 2> /dev/null; then
  echo "muon_compile imports from $ROOT already" >> "$REPORT/install.log"
elif ! "$PY" -m pip install --no-deps --no-build-isolation --no-index -e "$ROOT" >> "$REPORT/install.log" 2>&1; then
  echo "gpu_check: installing the package failed, see $REPORT/install.log" >&2
  tail -5 "$REPORT/install.log" >&2
  exit 1
fi
WHEELS="${GPU_CHECK_WHEELS:-$ROOT/vendor/wheels}"
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  # a peer that does not install is reported by its arm, as failed; the rest still run
  for wheel in "$WHEELS"/*.whl; do
    "$PY" -m pip install --no-deps --no-index "$wheel" >> "$REPORT/install.log" 2>&1 || echo "gpu_check: $wheel did not install (install.log)" >&2
  done
else
  echo "no wheels in $WHEELS: the peers' arms will report that they are not installed" | tee -a "$REPORT/install.log" >&2
fi

ARMS=eager-torch,inductor-torch,muon,muon-cudagraph,muon-sym,muon-torch,roofline,roofline-auto,emerging,heavyball,dion
if [ "$DEVICE" = cuda ]; then
  # compiles at once: half the host's cores (a compile also runs threads of its own), at most 8
  WORKERS=$(( $(nproc) / 2 > 8 ? 8 : ($(nproc) / 2 > 0 ? $(nproc) / 2 : 1) ))
  BENCH_DEFAULT="--workload gpt-small,dense-1b,llama-8b-4l --arms $ARMS --reps 5 --compile-workers $WORKERS"
else
  # the steps checked, not the figures: C++ kernels built before (the tests' cache) are reused
  BENCH_DEFAULT="--workload tiny --arms $ARMS --reps 2 --warmup 1 --compile-workers 2 --kept-cache"
fi
if wanted bench; then
  step "single-device benchmark on $DEVICE"
  # shellcheck disable=SC2086
  bounded "$PY" scripts/bench_single_device.py --device "$DEVICE" --json "$REPORT/bench_single.json" \
    --trace-dir "$REPORT/traces" ${BENCH_SINGLE_ARGS:-$BENCH_DEFAULT} \
    > "$REPORT/bench_single.txt" 2> "$REPORT/bench_single.log" || status=1
fi

if wanted sym; then
  step "symmetric products against bmm on $DEVICE"
  SYM_ARGS=()
  [ "$DEVICE" = cpu ] && SYM_ARGS=(--sizes 32,64 --batch 4 --reps 2 --warmup 1)  # the steps checked: off CUDA the op is bmm
  bounded "$PY" scripts/bench_sym.py --device "$DEVICE" --json "$REPORT/bench_sym.json" "${SYM_ARGS[@]}" \
    > "$REPORT/bench_sym.txt" 2> "$REPORT/bench_sym.log" || status=1
fi

# the textbook iteration's two lowering choices, each form against the other
TEXTBOOK_ARGS=(--sizes 128,256,512,1024,2048,4096)
[ "$DEVICE" = cpu ] && TEXTBOOK_ARGS=(--sizes 32 --batch 4 --reps 2 --warmup 1)  # the steps checked, not the figures: one size
if wanted epilogue; then
  step "the textbook scalars: products' epilogues against a pointwise kernel on $DEVICE"
  bounded "$PY" scripts/bench_epilogue.py --device "$DEVICE" --json "$REPORT/bench_epilogue.json" "${TEXTBOOK_ARGS[@]}" \
    > "$REPORT/bench_epilogue.txt" 2> "$REPORT/bench_epilogue.log" || status=1
fi

if wanted orientation; then
  step "the tall matrices' layout: their own against transposed on $DEVICE"
  bounded "$PY" scripts/bench_epilogue.py --compare orientation --device "$DEVICE" --json "$REPORT/bench_orientation.json" \
    "${TEXTBOOK_ARGS[@]}" > "$REPORT/bench_orientation.txt" 2> "$REPORT/bench_orientation.log" || status=1
fi

if wanted write; then
  step "the stacks' write against the foreach write on $DEVICE"
  WRITE_ARGS=()
  [ "$DEVICE" = cpu ] && WRITE_ARGS=(--stacks 4x32x64,4x64x32 --reps 2 --warmup 1)  # the steps checked: off CUDA the op's fallback
  bounded "$PY" scripts/bench_write.py --device "$DEVICE" --json "$REPORT/bench_write.json" "${WRITE_ARGS[@]}" \
    > "$REPORT/bench_write.txt" 2> "$REPORT/bench_write.log" || status=1
fi

if wanted tests; then
  step "CUDA tests (pytest -m cuda)"
  if [ "$DEVICE" = cuda ]; then
    bounded "$PY" -m pytest -m cuda -q -p no:cacheprovider -n 4 --junitxml="$REPORT/junit.xml" tests \
      > "$REPORT/tests.log" 2>&1 || status=1
    tail -3 "$REPORT/tests.log" >&2
  else
    echo "--device cpu: no CUDA tests to run" | tee "$REPORT/tests.log" >&2
  fi
fi

if wanted calibrate; then
  step "calibrate: the advisor's profile of this $DEVICE"
  CALIBRATE_ARGS=()
  [ "$DEVICE" = cpu ] && CALIBRATE_ARGS=(--max-size 128 --max-bytes 65536 --reps 1)  # the steps checked, not the figures
  bounded "$PY" -m muon_compile.advisor.calibrate --device "$DEVICE" --out "$REPORT/profile.json" "${CALIBRATE_ARGS[@]}" \
    > "$REPORT/calibrate.txt" 2>&1 || status=1
  tail -3 "$REPORT/calibrate.txt" >&2
fi

if wanted distributed; then
  if [ "$DEVICE" = cuda ] && [ "$GPUS" -ge 2 ]; then
    step "distributed benchmark, torchrun on $GPUS GPUs, NCCL"
    # shellcheck disable=SC2086
    bounded "$PY" -m torch.distributed.run --nproc-per-node "$GPUS" scripts/bench_distributed.py --backend nccl ${BENCH_DIST_ARGS:-} \
      > "$REPORT/bench_distributed.txt" 2> "$REPORT/bench_distributed.log" || status=1
  else
    echo "$GPUS GPU(s) on $DEVICE: the distributed benchmark needs 2 or more (skipped)" | tee "$REPORT/bench_distributed.txt" >&2
  fi
fi

"$PY" scripts/gpu_summary.py "$REPORT" | tee "$REPORT/summary.txt"
exit $status
