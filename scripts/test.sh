#!/usr/bin/env bash
# The test suite: install if needed, then run pytest (extra arguments go to pytest).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
python -m pytest -q "$@"
