#!/usr/bin/env bash
# Every in-process benchmark of BENCHMARKS.md, in one go (about 15 minutes on 2 cores):
#   decision cost (criterion, tollgate next to governor), bytes per key, eviction, and
#   instructions per check under callgrind (if valgrind is installed).
# Usage: scripts/bench.sh [criterion filter]   e.g. scripts/bench.sh hot_key
# Results: target/criterion/ (HTML off) and the text on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
filter=${1:-}
cargo bench --bench decision -- --warm-up-time 1 --measurement-time 2 --sample-size 10 --noplot $filter
cargo run --release --quiet -p tollgate-tools --bin memory_per_key
cargo run --release --quiet -p tollgate-tools --bin bench_eviction
if command -v valgrind >/dev/null; then
    scripts/bench_callgrind.sh 50000
fi
