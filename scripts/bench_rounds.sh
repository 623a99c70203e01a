#!/usr/bin/env bash
# Side-by-side wall-time rounds: every implementation runs once per round, interleaved, so that a
# noisy machine slows all of them alike; prints the median ns per check (aggregate over threads) and
# the ratio to governor (quanta clock) per workload.
# Usage: scripts/bench_rounds.sh [ROUNDS] [N]      (defaults 5 rounds of 2,000,000 checks)
# PRESET=default (the default): the configuration a user gets from the builder's defaults next to the
#   fastest clock, allow-all at 10^9 per second (mode allow_1e9), governor's DefaultKeyedRateLimiter
#   at the same rate; one and two threads.
# PRESET=best: the earlier workload (u32::MAX per day, 1 per day), every strategy on CoarseClock
#   and SystemClock.
# Environment: IMPLS, KEYS, THREADS, MODES override the preset's lists; TIME=cpu ranks by the time the
#   threads spent on a CPU (summed over threads) instead of wall time, for a machine shared with other
#   work (with 2 threads it is the cost per check, not the aggregate rate); TOLLGATE_PIN=1 pins thread t
#   to CPU t (bench_callgrind), so that two threads run on two CPUs at once.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
n=${2:-2000000}
case ${PRESET:-default} in
default)
    d_impls="governor/quanta dashmap tollgate/token-bucket/coarse tollgate/token-bucket/default tollgate/fixed-window/default tollgate/sliding-window/default"
    d_modes="allow_1e9"
    ;;
best)
    d_impls="governor/quanta governor/monotonic tollgate/fixed-window/coarse tollgate/fixed-window/system tollgate/token-bucket/coarse tollgate/token-bucket/system tollgate/sliding-window/coarse tollgate/moving-window/coarse"
    d_modes="allow_all reject_all"
    ;;
*) echo "PRESET is default or best" >&2; exit 2 ;;
esac
impls=${IMPLS:-$d_impls}
keys_list=${KEYS:-"1 10000 1000000"}
threads_list=${THREADS:-"1 2"}
modes=${MODES:-$d_modes}
cargo build --release --quiet -p tollgate-tools --bin bench_callgrind
bin=target/release/bench_callgrind
raw=$(mktemp)
for r in $(seq "$rounds"); do
    for keys in $keys_list; do
        for mode in $modes; do
            for t in $threads_list; do
                for imp in $impls; do
                    out=$("$bin" "$imp" "$mode" "$keys" "$n" "$t")
                    if [ "${TIME:-wall}" = cpu ]; then
                        ns=$(echo "$out" | awk '{print $4}')
                    else
                        ns=$(echo "$out" | awk '{print $1}')
                    fi
                    echo "$keys $mode $t $imp $ns" >> "$raw"
                done
            done
        done
    done
    echo "round $r done" >&2
done
python3 - "$raw" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    keys, mode, t, imp, ns = line.split()
    k = (keys, mode, t)
    if (k, imp) not in rows:
        order.append((k, imp))
    rows[(k, imp)].append(float(ns))
print(f"{'keys':>8} {'mode':<11} {'thr':>3} {'implementation':<34} {'median ns':>10} {'M/s':>7} {'vs gov':>7}  rounds")
for (k, imp) in order:
    med = statistics.median(rows[(k, imp)])
    gov = statistics.median(rows[(k, 'governor/quanta')]) if (k, 'governor/quanta') in rows else float('nan')
    print(f"{k[0]:>8} {k[1]:<11} {k[2]:>3} {imp:<34} {med:>10.1f} {1e3/med:>7.1f} {med/gov:>7.2f}  " + " ".join(f"{x:.0f}" for x in rows[(k, imp)]))
PY
rm -f "$raw"
