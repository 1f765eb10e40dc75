#!/usr/bin/env bash
# Source this file: it makes sure the build tools and the cached virtual environment exist,
# builds the extension into that environment, and activates it.
# The venv lives outside the work tree, keyed by the hash of requirements/dev.txt, so the
# torch install happens once per machine, not on every run; requirements/docs.txt and
# requirements/video.txt are a second and a third layer on top, each keyed by its own hash.
# Strict mode while it runs; the caller's own shell options come back at the end (an interactive
# shell that sources this must not be left exiting on its next failing command).
# The caller's options are read in this shell, not through "$(set +o)": a command substitution
# runs with errexit off, so restoring its listing switched a strict caller's `set -e` off, and
# scripts/test.sh went on past a failing lint, docs or cargo step to report pytest's status alone.
_shardstream_restore_options=""
[[ -o errexit ]] || _shardstream_restore_options+="set +o errexit;"
[[ -o nounset ]] || _shardstream_restore_options+="set +o nounset;"
[[ -o pipefail ]] || _shardstream_restore_options+="set +o pipefail;"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"

# Debian packages: cmake and nasm build libjpeg-turbo from source (turbojpeg-sys; nothing is linked
# from the system); chromium runs the docs site's browser test (tests/test_docs_site.py), headless.
APT_PACKAGES=()
command -v cmake >/dev/null || APT_PACKAGES+=(cmake)
command -v nasm >/dev/null || APT_PACKAGES+=(nasm)
command -v chromium >/dev/null || APT_PACKAGES+=(chromium fonts-dejavu-core)
# FFmpeg 5.1 for the video kind (issue 54), which finds its libraries at run time (nothing is
# linked): the CLI makes the test clips from real photos; the -dev headers let a Rust test check
# the structure offsets the decoder reads (video/ffmpeg/layout.rs) against FFmpeg's own.
{ command -v ffmpeg >/dev/null && pkg-config --exists libavformat libswscale 2>/dev/null; } \
  || APT_PACKAGES+=(ffmpeg libavformat-dev libavcodec-dev libavutil-dev libswscale-dev pkg-config)
if [ "${#APT_PACKAGES[@]}" -gt 0 ]; then
  echo "[env] installing ${APT_PACKAGES[*]} (Debian packages)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}" >/dev/null
fi

SPEC_HASH="$( (cat "$ROOT/requirements/dev.txt"; "$PY" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)"
VENV="${SHARDSTREAM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/shardstream/venv-$SPEC_HASH}"
if [ ! -f "$VENV/.complete" ]; then
  echo "[env] creating $VENV (first run on this machine: downloads torch, several minutes)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r "$ROOT/requirements/dev.txt"
  touch "$VENV/.complete"
fi
# Layers on top of the torch one, each keyed by its own requirements file's hash: changing one
# re-installs only it. install_layer NAME FILE WHAT.
install_layer() {
  local hash
  hash="$(sha256sum "$ROOT/requirements/$2" | cut -c1-16)"
  if [ ! -f "$VENV/.$1-$hash" ]; then
    echo "[env] installing $3 (requirements/$2)"
    "$VENV/bin/python" -m pip install -q -r "$ROOT/requirements/$2"
    rm -f "$VENV"/."$1"-*
    touch "$VENV/.$1-$hash"
  fi
}
install_layer docs docs.txt "the docs site's tools"
install_layer video video.txt "the video kind's references"
unset -f install_layer  # a sourced file leaves no function behind in the caller's shell
# shellcheck disable=SC1091
source "$VENV/bin/activate"
export SHARDSTREAM_VENV="$VENV"

# Build the extension in release mode into the venv (incremental: fast when nothing changed).
(cd "$ROOT" && maturin develop --release -q >/dev/null 2>"$VENV/.maturin.log") || { cat "$VENV/.maturin.log" >&2; exit 1; }
eval "$_shardstream_restore_options"
unset _shardstream_restore_options
