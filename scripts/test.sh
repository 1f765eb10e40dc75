#!/usr/bin/env bash
# The whole test suite from a clean clone: installs what is missing (cached), builds, then runs
# the linters, the docs build, the Rust unit tests, a short coverage-guided fuzz run and pytest.
# Extra arguments go to pytest. SHARDSTREAM_FUZZ_SECONDS sets the fuzz budget per target (default 15 here).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
source scripts/env.sh

echo "== lint"
# Python files only: ruff would also format the README's code samples.
PY_PATHS=(python tests benches train_clip.py docs/hooks.py scripts/*.py)
ruff check -q "${PY_PATHS[@]}"
ruff format -q --check "${PY_PATHS[@]}"
cargo fmt --check
cargo fmt --check --manifest-path fuzz/Cargo.toml
cargo clippy --release --quiet --all-targets --features python,fuzzing -- -D warnings

echo "== docs (generated reference pages current; mkdocs build --strict: no broken link)"
python scripts/gen_reference.py --check
# Into target/ (git-ignored); tests/test_docs_site.py builds its own copy to open in a browser.
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir target/docs-site

echo "== cargo test"
cargo test --release --quiet

echo "== fuzz (libFuzzer, ${SHARDSTREAM_FUZZ_SECONDS:-15} s per target)"
SHARDSTREAM_FUZZ_SECONDS="${SHARDSTREAM_FUZZ_SECONDS:-15}" bash scripts/fuzz.sh

echo "== pytest"
set +e
python -m pytest "$@"
status=$?
set -e
# pytest exits 5 when it collected no test: that is not a failure of the suite.
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests"
  exit 0
fi
exit "$status"
