#!/usr/bin/env bash
# Source this file: the demo's environment, smaller than the test suite's (scripts/env.sh). It
# makes a cached venv from requirements/demo.txt (keyed by that file's hash and the Python
# version, so it is made once per machine), builds the extension into it, and activates it.
# Strict mode while it runs; the caller's shell options come back at the end.
_shardstream_demo_saved_options="$(set +o)"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"

# cmake and nasm build libjpeg-turbo from source (turbojpeg-sys); nothing is linked from the system.
if ! command -v cmake >/dev/null || ! command -v nasm >/dev/null; then
  echo "[demo-env] installing cmake and nasm (Debian packages)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq cmake nasm >/dev/null
fi

SPEC_HASH="$( (cat "$ROOT/requirements/demo.txt"; "$PY" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)"
VENV="${SHARDSTREAM_DEMO_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/shardstream/demo-venv-$SPEC_HASH}"
if [ ! -f "$VENV/.complete" ]; then
  echo "[demo-env] creating $VENV (first run on this machine: downloads torch)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r "$ROOT/requirements/demo.txt"
  touch "$VENV/.complete"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"

# Build the extension in release mode into the venv (incremental: fast when nothing changed).
(cd "$ROOT" && maturin develop --release -q >/dev/null 2>"$VENV/.maturin.log") || { cat "$VENV/.maturin.log" >&2; exit 1; }
eval "$_shardstream_demo_saved_options"
unset _shardstream_demo_saved_options
