# Sourced by scripts/demo.sh and scripts/test.sh: create (once) and activate a virtual
# environment with torch (installed first, so the installer never resolves another build of
# it) and this package, by scripts/installer.sh (uv where it is on PATH, else pip).
#   MUON_COMPILE_VENV   the environment's folder (default .venv)
#   MUON_COMPILE_TORCH  the torch version to install (default 2.13.0, a CPU build here;
#                       PyPI's 2.11.x / 2.15.x are CUDA builds that also run on a CPU)
set -euo pipefail
# Python writes its bytecode caches (__pycache__) even where PYTHONDONTWRITEBYTECODE is set (as on
# this project's CI machine): uv installs no .pyc, so without them every process of a fresh
# environment compiles torch's sources again (importing muon_compile and Inductor: 10.8 s against
# 4.4 s on torch 2.15), every pytest worker and every subprocess of a test.
unset PYTHONDONTWRITEBYTECODE
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MUON_COMPILE_VENV:-$ROOT/.venv}"
TORCH_VERSION="${MUON_COMPILE_TORCH:-2.13.0}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"

# shellcheck source=scripts/installer.sh
source "$ROOT/scripts/installer.sh"
install_into "$VENV/bin/python" "torch==$TORCH_VERSION"
# the test extras (pinned in pyproject.toml), and Triton where this torch pins none of its own
extras=test
if ! "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(not any(r.startswith("triton") for r in m.requires("torch") or []))'; then
  extras=test,triton
fi
install_into "$VENV/bin/python" -e "$ROOT[$extras]"
# Emerging-Optimizers declares Python 3.12, for typing.override alone (tests/users/test_released.py):
# on an older Python its pin from the test extra is installed without that check and without
# its dependencies (torch and absl-py, in the extra already)
if "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info >= (3, 12))'; then
  pin="$("$VENV/bin/python" -c 'import sys, tomllib
extra = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["test"]
print(next(r.split(";")[0].strip() for r in extra if r.startswith("emerging-optimizers")))' "$ROOT/pyproject.toml")"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --ignore-requires-python "$pin"
fi
cd "$ROOT"
