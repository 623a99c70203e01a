#!/usr/bin/env bash
# HTTP benchmark (BENCHMARKS.md "HTTP"): wrk against an axum hello world with no limiter,
# with a layer that does nothing (identity: what any Router::layer costs), with tollgate, with
# tower_governor, and a static 429 handler; variants interleaved round by round, server and wrk
# pinned to different cores; each result reported as a ratio to its reference (allow: to no limiter
# and to `identity`, the floor for any layer). Two measures per run: requests per second (wrk), and
# the server's on-CPU time per request (utime + stime from /proc, over wrk's request count), which
# other load on the machine disturbs less. Instruction counts, which it does not disturb at all:
# scripts/http_callgrind.sh.
#
#   bash scripts/http_bench.sh                  # 7 rounds x 5 s
#   ROUNDS=9 DURATION=10s bash scripts/http_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-7}
DURATION=${DURATION:-5s}
CONNS=${CONNS:-64}
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
if [ -z "${BIN:-}" ]; then # BIN=path: run that build of the server instead (before/after)
  cargo build --release -q -p tollgate-tools --bin http_bench_server
  BIN=${CARGO_TARGET_DIR:-target}/release/http_bench_server
fi
pin_server=""; pin_wrk=""
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then pin_server="taskset -c 0"; pin_wrk="taskset -c 1"; fi

ALLOW=${ALLOW:-"none identity tollgate:sliding-window tollgate:token-bucket tollgate:fixed-window metrics:token-bucket tower-governor tower-governor-headers"}
REJECT=${REJECT:-"static429 tollgate:sliding-window tollgate:token-bucket tollgate:fixed-window tower-governor"}
out=$(mktemp -d)

run() { # variant workload -> requests/s
  local variant=$1 workload=$2 log=$out/server.log
  TOKIO_WORKER_THREADS=1 $pin_server "$BIN" "$variant" "$workload" 127.0.0.1:0 >"$out/addr" 2>"$log" &
  local pid=$!
  for _ in $(seq 600); do grep -q listening "$out/addr" 2>/dev/null && break; sleep 0.05; done
  local url; url=$(sed -n 's/listening on //p' "$out/addr")
  local cpu0; cpu0=$(cpu_ticks "$pid")
  local w; w=$($pin_wrk wrk -t1 -c"$CONNS" -d"$DURATION" "$url/")
  local cpu1; cpu1=$(cpu_ticks "$pid")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  local rps; rps=$(awk '/Requests\/sec/ {print $2}' <<<"$w")
  local n; n=$(awk '/requests in/ {print $1}' <<<"$w")
  # on-CPU microseconds per request of the server (clock ticks of utime + stime)
  local us; us=$(awk -v t=$((cpu1 - cpu0)) -v n="$n" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { if (n > 0) printf "%.3f", t * 1e6 / hz / n }')
  echo "$rps $us"
}

cpu_ticks() { # pid -> utime + stime in clock ticks (fields 14 and 15 of /proc/PID/stat)
  awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"
}

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for workload in allow reject; do
  [ "$workload" = allow ] && variants=$ALLOW || variants=$REJECT
  for r in $(seq "$ROUNDS"); do
    for v in $variants; do
      echo "$workload $r $v $(run "$v" "$workload")" | tee -a "$out/results"
    done
  done
done

echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out/results" <<'PY'
import sys, statistics, collections
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 5]  # a failed run has no figure
by = collections.defaultdict(dict)
for w, r, v, rps, us in rows:
    by[(w, int(r))][v] = (float(rps), float(us))
refs = {"allow": ["none", "identity"], "reject": ["static429"]}
for w in ("allow", "reject"):
    rounds = [d for (ww, _), d in sorted(by.items()) if ww == w]
    variants = list(dict.fromkeys(v for d in rounds for v in d))
    for ref in refs[w]:
        if not any(ref in d for d in rounds):
            continue
        print(f"\n{w}: reference {ref}; medians and per-round ratios ({len(rounds)} rounds)")
        print("req/s ratio: variant / reference; CPU ratio: reference's on-CPU time per request / the variant's (both: higher is faster)")
        print(f"| variant | median req/s | req/s ratio to {ref} (median) | min | max | median CPU us/request | CPU ratio to {ref} (median) | min | max |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for v in variants:
            rps = [d[v][0] for d in rounds if v in d]
            us = [d[v][1] for d in rounds if v in d]
            rr = [d[v][0] / d[ref][0] for d in rounds if v in d and ref in d and d[ref][0]]
            cr = [d[ref][1] / d[v][1] for d in rounds if v in d and ref in d and d[v][1]]
            if not rps or not rr or not cr:
                continue
            print(f"| {v} | {statistics.median(rps):.0f} | {statistics.median(rr):.3f} | {min(rr):.3f} | {max(rr):.3f} "
                  f"| {statistics.median(us):.2f} | {statistics.median(cr):.3f} | {min(cr):.3f} | {max(cr):.3f} |")
PY
