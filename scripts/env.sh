# Sourced by scripts/demo.sh and scripts/test.sh: create (once) and activate .venv with
# torch 2.13.0 (installed first, so pip never resolves a CUDA build) and this package.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MUON_COMPILE_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python -m pip install --quiet --disable-pip-version-check -e "$ROOT[test]"
cd "$ROOT"
