#!/usr/bin/env bash
# The main job: install if needed, then train a tiny GPT with an eager and a compiled Muon step.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
python scripts/train_demo.py "$@"
