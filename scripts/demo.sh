#!/usr/bin/env bash
# The main job from a clean clone: sets up what the demo needs (requirements/demo.txt, cached in
# its own venv: not the test suite's), then trains the small CLIP demo on the embedded default
# dataset (generated on first run) with 2 processes on the CPU.
# Extra arguments go to train_clip.py (e.g. --config vit_b32 --train.batch_size 64).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
source scripts/demo_env.sh
NPROC="${NPROC:-2}"
exec python -m torch.distributed.run --standalone --nproc_per_node="$NPROC" train_clip.py "$@"
