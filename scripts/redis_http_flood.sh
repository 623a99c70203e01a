#!/usr/bin/env bash
# Over HTTP (BENCHMARKS.md "A flood over HTTP"): the `server` example, release
# build, with its defaults (fail-open, 50 ms store timeout, key = peer IP: every wrk connection comes
# from 127.0.0.1, so one key) and `--quota LIMIT/hour`, on one instance and on two instances sharing
# one throw-away redis-server, flooded by wrk with CONNS connections for SECS seconds (two instances:
# two wrk processes at once, CONNS/2 connections each); every strategy. Counts 200 / 429 / other
# statuses with a wrk Lua script, and prints wrk's end-to-end p99. Before and after, the same flood on
# a static handler without a limiter (tools/src/bin/http_bench_server.rs `none`): its p99 measures the
# machine. BUILD=0 skips the builds, STATIC_RUN=0 the static handler; SERVER_ARGS adds flags to the
# server (e.g. SERVER_ARGS="--store-timeout 500"). After each flood the limiter's own wait for the
# store is read from each server's /metrics (`tollgate_store_latency_seconds`, the decisions the
# store did not answer at once): its count and the buckets holding its median and its p99.
#
#   bash scripts/redis_http_flood.sh
#   CONNS=2000 SECS=5 LIMIT=1000 STRATEGIES="token-bucket" bash scripts/redis_http_flood.sh
#
# With CHECK=1 (scripts/long.sh) it exits 1 when a run admits more than LIMIT + 2 % or less than
# 95 % of LIMIT, or answers anything but 200 and 429. A key has at most two checks in flight per
# instance and the rest of its flood waits behind them (never counted by Redis), so the lower bound
# needs only that the flood lasts until the limit is reached (at 2000 connections, well under SECS).
set -euo pipefail
cd "$(dirname "$0")/.."
CONNS=${CONNS:-2000}
SECS=${SECS:-5}
LIMIT=${LIMIT:-1000}
STRATEGIES=${STRATEGIES:-"fixed-window fixed-window-first-hit moving-window sliding-window token-bucket leaky-bucket"}
INSTANCES=${INSTANCES:-"1 2"}
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
if [ "${BUILD:-1}" = 1 ]; then
  cargo build --release -q --features redis --example server
  cargo build --release -q -p tollgate-tools --bin http_bench_server
fi
SERVER=target/release/examples/server
STATIC=target/release/http_bench_server
out=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$out"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
  --loglevel warning >"$out/redis.log" 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
for _ in $(seq 200); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.05; done

cat >"$out/count.lua" <<'LUA'
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) ok = 0; limited = 0; other = 0 end
function response(status, headers, body)
  if status == 200 then ok = ok + 1 elseif status == 429 then limited = limited + 1 else other = other + 1 end
end
function done(summary, latency, requests)
  local o, l, x = 0, 0, 0
  for _, t in ipairs(threads) do o = o + t:get("ok"); l = l + t:get("limited"); x = x + t:get("other") end
  io.write(string.format("STATUS %d %d %d %d\n", o, l, x, summary.errors.connect + summary.errors.read
    + summary.errors.write + summary.errors.timeout))
  io.write(string.format("P99 %d P50 %d MAX %d\n", latency:percentile(99), latency:percentile(50), latency.max))
end
LUA

start() { # log-file command... ; sets URL
  local log=$1; shift
  "$@" >"$log.addr" 2>"$log" &
  pids+=("$!")
  for _ in $(seq 600); do grep -q listening "$log.addr" 2>/dev/null && break; sleep 0.05; done
  URL=$(sed -n 's/listening on //p' "$log.addr")
}

flood() { # conns url... ; each URL gets conns/number-of-URLs connections; prints one summary line
  local conns=$1; shift
  local n=$# i=0 w=()
  for url in "$@"; do
    wrk -t2 -c$((conns / n)) -d"${SECS}s" --timeout 10s -s "$out/count.lua" "$url/" >"$out/wrk.$i" 2>&1 &
    w+=("$!")
    i=$((i + 1))
  done
  wait "${w[@]}"
  python3 - "$out" "$n" <<'PY'
import sys
out, n = sys.argv[1], int(sys.argv[2])
ok = lim = oth = err = 0; p99 = []; p50 = []; mx = []
for i in range(n):
    for line in open(f"{out}/wrk.{i}"):
        f = line.split()
        if f[:1] == ["STATUS"]:
            ok += int(f[1]); lim += int(f[2]); oth += int(f[3]); err += int(f[4])
        if f[:1] == ["P99"]:
            p99.append(int(f[1])); p50.append(int(f[3])); mx.append(int(f[5]))
print(f"200 {ok} 429 {lim} other {oth} socket-errors {err} p50 {max(p50)/1000:.1f} ms "
      f"p99 {max(p99)/1000:.1f} ms max {max(mx)/1000:.1f} ms (worst of {n} wrk)")
open(f"{out}/last", "w").write(f"{ok} {oth}\n")
PY
}

failed=0
check() { # label ; the last flood's counts against the bound (CHECK=1)
  read -r ok other <"$out/last"
  if [ "${CHECK:-0}" = 1 ] && { [ $((ok * 100)) -gt $((LIMIT * 102)) ] || [ $((ok * 100)) -lt $((LIMIT * 95)) ] || [ "$other" -gt 0 ]; }; then
    echo "FAIL $1: $ok admitted (95 % of $LIMIT .. $LIMIT + 2 %), $other answers neither 200 nor 429"
    failed=1
  fi
}

store_wait() { # url... ; the store-latency histogram of the servers, summed
  for url in "$@"; do curl -s "$url/metrics"; done | python3 -c '
import sys
buckets = {}; count = 0
for line in sys.stdin:
    if line.startswith("tollgate_store_latency_seconds_bucket"):
        le = line.split("le=\"")[1].split("\"")[0]
        buckets[le] = buckets.get(le, 0) + float(line.split()[-1])
    elif line.startswith("tollgate_store_latency_seconds_count"):
        count += float(line.split()[-1])
def at(q):
    for le, n in sorted(buckets.items(), key=lambda kv: float(kv[0])):
        if n >= q * count:
            return "<= %s ms" % ("%g" % (float(le) * 1000) if le != "+Inf" else "inf")
    return "n/a"
print("  store wait (tollgate_store_latency_seconds): %d timed, p50 %s, p99 %s" % (count, at(0.5), at(0.99)))
'
}

stop_all_servers() {
  local keep=()
  for p in "${pids[@]}"; do
    if [ "$p" = "$redis_pid" ]; then keep+=("$p"); else kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; fi
  done
  pids=("${keep[@]}")
}

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $CONNS connections x ${SECS}s, limit $LIMIT/hour"
static_flood() {
  start "$out/static.log" "$STATIC" none allow 127.0.0.1:0
  printf 'static handler (http_bench_server none, no limiter): '
  flood "$CONNS" "$URL"
  stop_all_servers
}
[ "${STATIC_RUN:-1}" = 1 ] && static_flood
for strategy in $STRATEGIES; do
  for n in $INSTANCES; do
    redis-cli -p "$port" FLUSHALL >/dev/null
    urls=()
    for i in $(seq "$n"); do
      start "$out/server.$i.log" "$SERVER" --addr 127.0.0.1:0 --store "redis://127.0.0.1:$port" \
        --strategy "$strategy" --quota "$LIMIT/hour" ${SERVER_ARGS:-}
      urls+=("$URL")
    done
    printf '%s x%s: ' "$strategy" "$n"
    flood "$CONNS" "${urls[@]}"
    store_wait "${urls[@]}"
    check "$strategy x$n"
    stop_all_servers
  done
done
[ "${STATIC_RUN:-1}" = 1 ] && static_flood
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$failed"
