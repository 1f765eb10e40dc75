#!/usr/bin/env bash
# The whole test suite from a clean clone: installs what is missing (cached), builds, then runs
# the Rust unit tests and pytest. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
source scripts/env.sh

echo "== cargo test"
cargo test --release --quiet

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
