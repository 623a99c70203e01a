#!/usr/bin/env bash
# The longer tier's fuzzing: cargo-fuzz on every fuzz target (bodies in src/fuzzing.rs, compiled under
# cargo-fuzz's `--cfg fuzzing`; every test run replays the corpora through the same bodies in the lib's
# unit tests, src/fuzzing/replay.rs). One fuzzer at a time, one process each.
#
#   bash scripts/fuzz.sh                         # 30 minutes per target
#   FUZZ_SECONDS=60 bash scripts/fuzz.sh         # a short run
#   FUZZ_SECONDS=300 bash scripts/fuzz.sh strategy quota   # some targets only
#
# New inputs go to fuzz/target/corpus-work/<target> (not checked in), seeded from the checked-in
# corpus src/fuzzing/corpus/<target> (outside fuzz/: `cargo package` leaves out fuzz/, a crate of its
# own, and the packaged crate's tests replay the corpora).
# A crash leaves its input in fuzz/artifacts/<target>/ and makes the script exit 1 after all targets
# ran; replay one with `cargo fuzz run <target> <file>` inside fuzz/, then add the minimized input to
# src/fuzzing/corpus/<target>/ once fixed (`cargo test --lib fuzzing` replays every corpus file).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
SECS=${FUZZ_SECONDS:-1800}
ALL="forwarded quota ip_mask strategy redis_reply key_encoding"
TARGETS=${*:-$ALL}

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
# cargo-fuzz passes nightly-only flags (-Zsanitizer=address, ...); the stable toolchain takes them
# with RUSTC_BOOTSTRAP=1 (harmless on nightly).
export RUSTC_BOOTSTRAP=1
cargo fuzz build

failed=""
mkdir -p target/fuzz-logs
for t in $TARGETS; do
  work=target/corpus-work/$t
  log=target/fuzz-logs/$t.log
  mkdir -p "$work"
  echo "== $t: ${SECS}s (log: fuzz/$log)"
  set +e
  cargo fuzz run "$t" "$work" "../src/fuzzing/corpus/$t" -- \
    -max_total_time="$SECS" -print_final_stats=1 -rss_limit_mb=2048 -max_len=4096 >"$log" 2>&1
  rc=$?
  set -e
  grep -E 'INITED|DONE|stat::number_of_executed_units|stat::average_exec_per_sec|panicked|SUMMARY|Test unit written' "$log" | tail -8 || true
  if [ "$rc" -ne 0 ]; then failed="$failed $t"; fi
done
if [ -n "$failed" ]; then
  echo "fuzz: crashes in:$failed (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzz: 0 crashes in: $TARGETS (${SECS}s each)"
