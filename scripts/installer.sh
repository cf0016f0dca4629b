# Sourced by scripts/env.sh and .ci/run: `install_into PYTHON ARGS...` installs ARGS (pip's
# arguments) into the environment of the interpreter PYTHON. The installer is uv where it is
# on PATH (a CUDA build of torch in about 15 s from uv's cache, where pip takes about 55 s),
# else pip. uv reads no pip configuration, so it is given pip's find-links (where this
# machine keeps its CPU build of torch).
install_into() {
  local python="$1"
  shift
  if command -v uv >/dev/null 2>&1; then
    local links="${PIP_FIND_LINKS:-$("$python" -m pip config get global.find-links 2>/dev/null || true)}"
    local args=()
    for link in $links; do args+=(--find-links "$link"); done
    uv pip install --quiet --python "$python" "${args[@]}" "$@"
  else
    "$python" -m pip install --quiet --disable-pip-version-check "$@"
  fi
}
