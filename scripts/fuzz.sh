#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers with libFuzzer, on stable Rust (issue 15).
#
#   bash scripts/fuzz.sh                      # every target, 30 min each (the on-demand run)
#   bash scripts/fuzz.sh --seconds 20 tar     # one target, 20 s
#   SHARDSTREAM_FUZZ_JOBS=2 bash scripts/fuzz.sh   # two targets at a time
#
# The targets (fuzz/fuzz_targets, checks in rust/src/check/fuzzing) are built with LLVM's
# sanitizer-coverage instrumentation, which stable rustc has; what needs nightly is only the
# address sanitizer (-Zsanitizer), which Rust's bounds checks make far less needed. So this is
# `cargo fuzz run --sanitizer none`, without needing cargo-fuzz installed.
#
# Each target's corpus grows in target/fuzz/corpus/<target> (kept between runs, seeded from the
# real inputs in rust/src/check/fuzzing/seeds.rs); a crash, timeout or out-of-memory input lands in
# target/fuzz/artifacts/<target>/ and fails the run. Commit such an input as a regression test.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_PER_TARGET="${SHARDSTREAM_FUZZ_SECONDS:-1800}"
JOBS="${SHARDSTREAM_FUZZ_JOBS:-1}"
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_PER_TARGET="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(tar group image index parquet jsonl documents video)

HOST="$(rustc -vV | sed -n 's/^host: //p')"
OUT="$ROOT/target/fuzz"
# The flags cargo-fuzz passes with --sanitizer none. --target keeps them off build scripts and
# proc macros, which must not be instrumented.
export RUSTFLAGS="-Cpasses=sancov-module \
 -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
 -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares \
 --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
echo "[fuzz] building ${TARGETS[*]} (instrumented, target/fuzz)"
cargo build --release -q --manifest-path "$ROOT/fuzz/Cargo.toml" --target "$HOST" \
  --target-dir "$OUT/build" $(printf -- '--bin %s ' "${TARGETS[@]}")
unset RUSTFLAGS
cargo build --release -q --manifest-path "$ROOT/Cargo.toml" --features fuzzing --example fuzz_seeds

run_target() {
  local t="$1" corpus="$OUT/corpus/$1" artifacts="$OUT/artifacts/$1" log="$OUT/logs/$1.log"
  mkdir -p "$corpus" "$artifacts" "$OUT/logs"
  "$ROOT/target/release/examples/fuzz_seeds" "$t" "$corpus"
  local rc=0
  # A Parquet page header is parsed by the parquet crate, whose thrift reader skips a list one
  # element at a time: a header claiming 2^31 elements takes 1.5 s to skip natively, 6 s under
  # this instrumentation (a hostile file costs that once a page: bounded, not a hang; see
  # docs/internals.md). The parquet target's inputs get 12 s, every other target's 5.
  local per_input=5
  [ "$t" = parquet ] && per_input=12
  # -rss_limit_mb bounds what one input may make the parser allocate; -timeout bounds one input.
  "$OUT/build/$HOST/release/$t" "$corpus" \
    -max_total_time="$SECONDS_PER_TARGET" -timeout="$per_input" -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 >"$log" 2>&1 || rc=$?
  local runs per_s peak
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
  per_s="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")"
  peak="$(sed -n 's/^stat::peak_rss_mb: *//p' "$log")"
  # The last status line's coverage and corpus (corp: inputs/bytes, after libFuzzer's own
  # reduction; the directory also keeps inputs that were later superseded).
  local status cov corp
  status="$(grep -E 'cov: [0-9]+ ft: [0-9]+ corp: ' "$log" | tail -1 || true)"
  cov="$(grep -Eo 'cov: [0-9]+ ft: [0-9]+' <<<"$status" || true)"
  corp="$(grep -Eo 'corp: [0-9]+/[0-9]+[a-zA-Z]*' <<<"$status" | cut -d' ' -f2 || true)"
  printf '[fuzz] %-9s %s s: %s runs, %s exec/s, corpus %s inputs (%s in %s), %s, peak RSS %s MB, exit %s\n' \
    "$t" "$SECONDS_PER_TARGET" "${runs:-?}" "${per_s:-?}" "${corp%%/*}" "${corp#*/}" "target/fuzz/corpus/$t" \
    "${cov:-cov ?}" "${peak:-?}" "$rc"
  if [ "$rc" -ne 0 ]; then
    echo "[fuzz] $t FAILED; its log ($log) ends:" >&2
    tail -40 "$log" >&2
    ls -l "$artifacts" >&2
    return 1
  fi
}

failed=0
pids=()
for t in "${TARGETS[@]}"; do
  run_target "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$JOBS" ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
exit "$failed"
