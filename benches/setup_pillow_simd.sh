#!/usr/bin/env bash
# Builds the webdataset + pillow-simd (AVX2) contender in its own cached venv (pillow-simd
# replaces PIL, so it cannot share the main one) and prints its python path.
# Usage: PILLOW_SIMD_PYTHON=$(bash benches/setup_pillow_simd.sh) python benches/bench_decode.py
set -euo pipefail
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/shardstream/pillow-simd-avx2-12.1.1"
if [ ! -f "$VENV/.complete" ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get install -y -qq libjpeg62-turbo-dev zlib1g-dev >/dev/null
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >&2
  "$VENV/bin/pip" install -q numpy webdataset==1.0.2 >&2
  "$VENV/bin/pip" uninstall -q -y pillow >&2 || true
  CC="cc -mavx2" "$VENV/bin/pip" install -q --no-binary pillow-simd --no-cache-dir pillow-simd==12.1.1.post0 >&2
  touch "$VENV/.complete"
fi
echo "$VENV/bin/python"
