#!/usr/bin/env bash
# Two or more builds of bench_callgrind side by side (e.g. the store before and after a change, each
# copied out of target/release), interleaved per round, one and two threads, threads pinned
# (TOLLGATE_PIN=1); prints the median wall and CPU ns per check of each build.
# Usage: scripts/bench_binaries.sh ROUNDS N KEYS "IMPL..." BINARY...
# Environment: EXTRA="VAR=value" runs every binary a second time with that variable set (a variant
#   of the environment, e.g. EXTRA=GLIBC_TUNABLES=glibc.malloc.hugetlb=1), THREADS (default "1 2").
set -euo pipefail
rounds=$1; n=$2; keys=$3; impls=$4; shift 4
variants=("")
if [ -n "${EXTRA:-}" ]; then variants+=("$EXTRA"); fi
raw=$(mktemp)
for _ in $(seq "$rounds"); do
    for imp in $impls; do
        for t in ${THREADS:-1 2}; do
            for b in "$@"; do
                for v in "${variants[@]}"; do
                    out=$(env TOLLGATE_PIN=1 $v "$b" "$imp" allow_1e9 "$keys" "$n" "$t")
                    echo "$(basename "$b")${v:+ +$v} | $imp | $t | $(echo "$out" | awk '{print $1, $4}')" >> "$raw"
                done
            done
        done
    done
done
python3 - "$raw" <<'PY'
import sys, statistics as st, collections
d = collections.defaultdict(lambda: ([], []))
order = []
for line in open(sys.argv[1]):
    b, imp, t, times = [x.strip() for x in line.split("|")]
    w, c = times.split()
    k = (imp, t, b)
    if k not in d:
        order.append(k)
    d[k][0].append(float(w))
    d[k][1].append(float(c))
print(f"{'implementation':<34} {'thr':>3} {'build':<46} {'wall':>7} {'cpu':>7}  wall rounds")
for k in order:
    w, c = d[k]
    print(f"{k[0]:<34} {k[1]:>3} {k[2]:<46} {st.median(w):>7.1f} {st.median(c):>7.1f}  "
          + " ".join(f"{x:.0f}" for x in w))
PY
rm -f "$raw"
