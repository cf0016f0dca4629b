#!/usr/bin/env bash
# The test suite: install if needed, then run pytest (extra arguments go to pytest).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# Two pytest workers (pytest-xdist) unless MUON_COMPILE_TEST_WORKERS says otherwise (0: all
# in this process): a compile leaves a core idle while it traces, another worker fills it
# (docs/testing.md, "Two workers"). worksteal: a worker that runs out of tests takes half of
# the other's queue, so the two end together (the slow tests run first: tests/conftest.py).
python -m pytest -q -n "${MUON_COMPILE_TEST_WORKERS:-2}" --dist worksteal "$@"
