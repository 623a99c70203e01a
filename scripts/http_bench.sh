#!/usr/bin/env bash
# HTTP benchmark (issue 5, BENCHMARKS.md "HTTP"): wrk against an axum hello world with no limiter,
# with a layer that does nothing (identity: what any Router::layer costs), with tollgate, with
# tower_governor, and a static 429 handler; variants interleaved round by round, server and wrk
# pinned to different cores; each result reported as a ratio to its reference. Instruction counts,
# which a loaded machine does not disturb: scripts/http_callgrind.sh.
#
#   bash scripts/http_bench.sh                  # 7 rounds x 5 s
#   ROUNDS=9 DURATION=10s bash scripts/http_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-7}
DURATION=${DURATION:-5s}
CONNS=${CONNS:-64}
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
cargo build --release -q -p tollgate-tools --bin http_bench_server
BIN=target/release/http_bench_server
pin_server=""; pin_wrk=""
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then pin_server="taskset -c 0"; pin_wrk="taskset -c 1"; fi

ALLOW=${ALLOW:-"none identity tollgate:sliding-window tollgate:token-bucket tollgate:fixed-window tower-governor tower-governor-headers"}
REJECT=${REJECT:-"static429 tollgate:sliding-window tollgate:token-bucket tollgate:fixed-window tower-governor"}
out=$(mktemp -d)

run() { # variant workload -> requests/s
  local variant=$1 workload=$2 log=$out/server.log
  TOKIO_WORKER_THREADS=1 $pin_server "$BIN" "$variant" "$workload" 127.0.0.1:0 >"$out/addr" 2>"$log" &
  local pid=$!
  for _ in $(seq 600); do grep -q listening "$out/addr" 2>/dev/null && break; sleep 0.05; done
  local url; url=$(sed -n 's/listening on //p' "$out/addr")
  local rps; rps=$($pin_wrk wrk -t1 -c"$CONNS" -d"$DURATION" "$url/" | awk '/Requests\/sec/ {print $2}')
  kill "$pid"; wait "$pid" 2>/dev/null || true
  echo "$rps"
}

for workload in allow reject; do
  [ "$workload" = allow ] && variants=$ALLOW || variants=$REJECT
  for r in $(seq "$ROUNDS"); do
    for v in $variants; do
      echo "$workload $r $v $(run "$v" "$workload")" | tee -a "$out/results"
    done
  done
done

python3 - "$out/results" <<'PY'
import sys, statistics, collections
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 4]  # a failed run has no figure
by = collections.defaultdict(dict)
for w, r, v, rps in rows:
    by[(w, int(r))][v] = float(rps)
for w, ref in (("allow", "none"), ("reject", "static429")):
    rounds = [d for (ww, _), d in sorted(by.items()) if ww == w]
    variants = list(dict.fromkeys(v for d in rounds for v in d))
    print(f"\n{w}: reference {ref}; median req/s and median of per-round ratios ({len(rounds)} rounds)")
    print("| variant | median req/s | ratio to " + ref + " (median) | min | max |")
    print("| --- | --- | --- | --- | --- |")
    for v in variants:
        rps = [d[v] for d in rounds if v in d]
        ratios = [d[v] / d[ref] for d in rounds if v in d and d.get(ref)]
        if not rps or not ratios:
            continue
        print(f"| {v} | {statistics.median(rps):.0f} | {statistics.median(ratios):.3f} | {min(ratios):.3f} | {max(ratios):.3f} |")
PY
