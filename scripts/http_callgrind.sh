#!/usr/bin/env bash
# Instructions per HTTP request (BENCHMARKS.md "HTTP"): the bench server
# (`tools/src/bin/http_bench_server.rs`) under callgrind, one keep-alive connection from a Python
# client; the instructions between `callgrind_control -z` after WARM requests and `-d` after N more,
# over N, in one server process per variant, on the thread that serves the connection; the ratio to
# identity (allow) or static429 (reject) when measured in the same run; and, apart, what the
# process's other threads ran meanwhile (background loops that follow wall time, not requests).
# Unlike wrk, a run repeats within about 170 instructions (see ROUNDS below for why, and what the
# script does about it).
#
#   bash scripts/http_callgrind.sh                          # every variant below, N=3000, WARM=500,
#                                                           # ROUNDS=3 (median and range reported)
#   N=2000 ALLOW="none tollgate:token-bucket" REJECT="" bash scripts/http_callgrind.sh
#   KEEP=/tmp/cg bash scripts/http_callgrind.sh  # also keep each variant's profile of the measured
#                                                # requests (KEEP/WORKLOAD-VARIANT.worker.out, and
#                                                # .THREAD.out for the other threads)
#   CG_OPTS="--dump-instr=yes" KEEP=/tmp/cg ...  # more callgrind options, e.g. for callgrind_annotate
#                                                # --auto=yes on a build with line tables
#                                                # (CARGO_PROFILE_RELEASE_DEBUG=line-tables-only)
# Needs valgrind (callgrind_control talks to the server through vgdb, which needs ptrace) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-3000}
WARM=${WARM:-500}
ALLOW=${ALLOW-"none identity tollgate:token-bucket metrics:token-bucket tollgate:sliding-window"}
REJECT=${REJECT-"static429 tollgate:token-bucket tollgate:sliding-window"}
if [ -z "${BIN:-}" ]; then # BIN=path: measure that build of the server instead (before/after)
  cargo build --release -q -p tollgate-tools --bin http_bench_server
  BIN=${CARGO_TARGET_DIR:-target}/release/http_bench_server
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

count() { # variant workload -> instructions per request over N requests after WARM
  local variant=$1 workload=$2 dump=$out/dump
  rm -f "$dump"*
  : >"$out/addr"
  # One process: its counts are zeroed after the warm-up and dumped after the measured requests
  # (callgrind_control, through vgdb), so that what a process does once at a time of its own
  # (a clock's calibration, a lazy start) stays out of the figure.
  TOKIO_WORKER_THREADS=1 valgrind --tool=callgrind --separate-threads=yes ${CG_OPTS:-} --callgrind-out-file="$dump" \
    "$BIN" "$variant" "$workload" 127.0.0.1:0 >"$out/addr" 2>"$out/vg" &
  local pid=$!
  for _ in $(seq 1200); do grep -q listening "$out/addr" 2>/dev/null && break; sleep 0.05; done
  local url; url=$(sed -n 's/listening on //p' "$out/addr")
  if ! python3 - "$url" "$WARM" "$N" "$pid" <<'PY'
import http.client, subprocess, sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
warm, n, pid = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
c = http.client.HTTPConnection(u.hostname, u.port)
def requests(k):
    for _ in range(k):
        c.request("GET", "/")
        r = c.getresponse()
        r.read()
def control(flag):
    # callgrind_control exits 0 whatever happened: its "OK." says the command reached the server.
    out = subprocess.run(["callgrind_control", flag, pid], capture_output=True, text=True, timeout=60)
    if "OK." not in out.stdout:
        sys.exit(f"callgrind_control {flag} {pid} failed: {out.stdout}{out.stderr}")
requests(warm)
control("-z")
requests(n)
control("-d")
c.close()
PY
  then
    kill -INT "$pid"; wait "$pid" 2>/dev/null || true
    cat "$out/vg" >&2
    return 1
  fi
  kill -INT "$pid"; wait "$pid" 2>/dev/null || true
  # The dump asked for (the files numbered .1-TT, one per thread; the exit writes the last ones).
  # The busiest thread is the Tokio worker that served the connection (TOKIO_WORKER_THREADS=1);
  # the others are loops that follow wall time (tollgate's coarse clock, the metrics refresh),
  # which valgrind's ~50x slowdown inflates per request: reported apart, as "background".
  local totals; totals=$(for f in "$dump".1-*; do
    echo "$(sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$f" | head -1) $f"
  done 2>/dev/null | awk 'NF == 2' | sort -n)
  if [ -z "$totals" ]; then
    echo "http_callgrind: no count for $variant ($workload)" >&2
    cat "$out/vg" >&2
    return 1
  fi
  local worker worker_file all
  read -r worker worker_file <<<"$(tail -1 <<<"$totals")"
  all=$(awk '{ s += $1 } END { print s }' <<<"$totals")
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"
    for f in "$dump".1-*; do
      local name=${f##*.1-}
      [ "$f" = "$worker_file" ] && name=worker
      cp "$f" "$KEEP/$workload-${variant//:/-}.$name.out"
    done
  fi
  echo "$((worker / N)) $(((all - worker) / N))"
}

# Each variant runs ROUNDS times (interleaved) and reports the median and the range. A figure
# moves between runs by up to ~170 instructions as glibc's heap falls one way or the other: the
# serving thread's free blocks decide whether hyper's 8 KiB read buffer comes from a bin (slower,
# `unlink_chunk`) or not, and what the process allocated before the requests (in an order that
# varies with thread timing) decides which.
# ratio: the reference's instructions over the variant's, medians (identity for allow, static429
# for reject, when measured in the same run; higher is faster, 1 = the reference)
ROUNDS=${ROUNDS:-3}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a whole number of at least 1" >&2; exit 2; }
# Numbers on stdin -> "median min-max" (the median: the lower of the two middle ones for an even
# count).
summary() { tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)], v[1] "-" v[NR] }'; }
printf '%-8s %-28s %14s %13s %8s %11s\n' workload variant instr/request range ratio background
for workload in allow reject; do
  [ "$workload" = allow ] && variants=$ALLOW ref=identity || { variants=$REJECT; ref=static429; }
  declare -A runs=() bg=()
  for _ in $(seq "$ROUNDS"); do
    for v in $variants; do
      got=$(count "$v" "$workload") || exit 1
      runs[$v]="${runs[$v]:-} ${got%% *}"
      bg[$v]="${bg[$v]:-} ${got##* }"
    done
  done
  declare -A med=() range=()
  for v in $variants; do
    read -r "med[$v]" "range[$v]" <<<"$(echo ${runs[$v]} | summary)"
  done
  for v in $variants; do
    ratio=-
    [ -n "${med[$ref]:-}" ] && ratio=$(awk -v r="${med[$ref]}" -v x="${med[$v]}" 'BEGIN { printf "%.3f", r / x }')
    read -r bg_median _ <<<"$(echo ${bg[$v]} | summary)"
    printf '%-8s %-28s %14s %13s %8s %11s\n' "$workload" "$v" "${med[$v]}" "${range[$v]}" "$ratio" "$bg_median"
  done
  unset runs bg med range
done
