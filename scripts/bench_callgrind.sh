#!/usr/bin/env bash
# Instructions per check under callgrind: (instructions at 2N checks - at N checks) / N.
# Usage: scripts/bench_callgrind.sh [N] [IMPL...]   (default: every implementation, hot key and 10^4
# keys, allow-all and reject-all). Needs valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100000}
shift || true
impls=("$@")
if [ ${#impls[@]} -eq 0 ]; then
    impls=(governor/quanta governor/monotonic)
    for s in fixed-window fixed-window-first-hit moving-window sliding-window token-bucket leaky-bucket; do
        impls+=("tollgate/$s/coarse" "tollgate/$s/system")
    done
fi
cargo build --release --quiet -p tollgate-tools --bin bench_callgrind
bin=target/release/bench_callgrind
count() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$@" 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
printf '%-40s %-11s %8s %14s\n' impl mode keys instr/check
for keys in 1 10000; do
    for mode in allow_all reject_all; do
        for imp in "${impls[@]}"; do
            a=$(count "$imp" "$mode" "$keys" "$n")
            b=$(count "$imp" "$mode" "$keys" $((2 * n)))
            printf '%-40s %-11s %8s %14s\n' "$imp" "$mode" "$keys" $(((b - a) / n))
        done
    done
done
