#!/usr/bin/env bash
# Fair shedding and a full limit under a flood, over HTTP: the `server` example, release build, with
# its defaults (fail-open, 50 ms store timeout) on one throw-away redis-server, keyed by a header
# (`--key header:x-client`), `--quota LIMIT/hour`, one instance and two instances sharing Redis.
# One client floods the key `flood` with wrk (CONNS connections; two instances: CONNS/2 each) while
# CLIENTS clients, each with a key of its own, send RATE requests a second each (keep-alive, one
# request at a time), all for SECS seconds. Prints, per run: the flooding key's 200s against the
# limit, and the clients' 200 / 429 / other answers.
#
#   bash scripts/redis_fairness.sh
#   CONNS=2000 CLIENTS=20 RATE=5 SECS=10 LIMIT=1000 INSTANCES="1 2" bash scripts/redis_fairness.sh
#
# With CHECK=1 (scripts/long.sh) it exits 1 when a run breaks a bound: the clients get less than
# 99 % of their requests admitted, the flooding key gets more than LIMIT + 2 % or less than 95 % of
# LIMIT (FLOOD_ONLY=1 runs the flood without the clients: the "full to the limit" figure), or any
# answer is neither 200 nor 429. STRATEGY picks the strategy (default sliding-window); BUILD=0 skips
# the build; SERVER_ARGS adds flags to the servers (e.g. SERVER_ARGS="--store-timeout 500").
set -euo pipefail
export NO_COLOR=1 # plain log lines, to read the shed warning
cd "$(dirname "$0")/.."
CONNS=${CONNS:-2000}
CLIENTS=${CLIENTS:-20}
RATE=${RATE:-5}
SECS=${SECS:-10}
LIMIT=${LIMIT:-1000}
STRATEGY=${STRATEGY:-sliding-window}
INSTANCES=${INSTANCES:-"1 2"}
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
[ "${BUILD:-1}" = 1 ] && cargo build --release -q --features redis --example server
SERVER=${CARGO_TARGET_DIR:-target}/release/examples/server
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

cat >"$out/flood.lua" <<'LUA'
wrk.headers["x-client"] = "flood"
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) ok = 0; limited = 0; other = 0 end
function response(status, headers, body)
  if status == 200 then ok = ok + 1 elseif status == 429 then limited = limited + 1 else other = other + 1 end
end
function done(summary, latency, requests)
  local o, l, x = 0, 0, 0
  for _, t in ipairs(threads) do o = o + t:get("ok"); l = l + t:get("limited"); x = x + t:get("other") end
  io.write(string.format("STATUS %d %d %d\n", o, l, x))
end
LUA

# The well-behaved clients: one thread each, RATE requests a second on a keep-alive connection,
# spread over the instances; prints "ok limited other".
cat >"$out/clients.py" <<'PY'
import http.client, sys, threading, time, urllib.parse
urls, clients, rate, secs = sys.argv[1].split(), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
counts = [0, 0, 0]
lock = threading.Lock()
def client(i):
    u = urllib.parse.urlparse(urls[i % len(urls)])
    conn = None
    start = time.monotonic()
    for n in range(int(rate * secs)):
        time.sleep(max(0.0, start + n / rate - time.monotonic()))
        try:
            if conn is None:
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
            conn.request("GET", "/", headers={"x-client": f"client-{i}"})
            r = conn.getresponse(); r.read()
            slot = 0 if r.status == 200 else 1 if r.status == 429 else 2
        except Exception:
            conn = None
            slot = 2
        with lock:
            counts[slot] += 1
threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(*counts)
PY

start() { # log-file command... ; sets URL
  local log=$1; shift
  "$@" >"$log.addr" 2>"$log" &
  pids+=("$!")
  for _ in $(seq 600); do grep -q listening "$log.addr" 2>/dev/null && break; sleep 0.05; done
  URL=$(sed -n 's/listening on //p' "$log.addr")
}

stop_all_servers() {
  local keep=()
  for p in "${pids[@]}"; do
    if [ "$p" = "$redis_pid" ]; then keep+=("$p"); else kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; fi
  done
  pids=("${keep[@]}")
}

failed=0
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); flood $CONNS connections, $CLIENTS clients x $RATE req/s, ${SECS}s, limit $LIMIT/hour, $STRATEGY"
for n in $INSTANCES; do
  redis-cli -p "$port" FLUSHALL >/dev/null
  urls=()
  for i in $(seq "$n"); do
    start "$out/server.$i.log" "$SERVER" --addr 127.0.0.1:0 --store "redis://127.0.0.1:$port" \
      --strategy "$STRATEGY" --quota "$LIMIT/hour" --key header:x-client ${SERVER_ARGS:-}
    urls+=("$URL")
  done
  w=()
  i=0
  for url in "${urls[@]}"; do
    wrk -t2 -c$((CONNS / n)) -d"${SECS}s" --timeout 10s -s "$out/flood.lua" "$url/" >"$out/wrk.$i" 2>&1 &
    w+=("$!")
    i=$((i + 1))
  done
  if [ "${FLOOD_ONLY:-0}" = 1 ]; then
    echo "- - -" >"$out/clients"
  else
    python3 "$out/clients.py" "${urls[*]}" "$CLIENTS" "$RATE" "$SECS" >"$out/clients"
  fi
  wait "${w[@]}"
  read -r flood_ok flood_other < <(awk '$1 == "STATUS" { o += $2; x += $4 } END { print o + 0, x + 0 }' "$out"/wrk.*)
  read -r c_ok c_limited c_other <"$out/clients"
  shed=$(grep -h "shed" "$out"/server.*.log | tail -n 1 | sed 's/.*shed_total=\([0-9]*\).*/\1/' || true)
  echo "x$n: flooding key admitted $flood_ok (limit $LIMIT, other $flood_other); clients 200 $c_ok 429 $c_limited other $c_other; last shed warning total ${shed:-none}"
  if [ "${CHECK:-0}" = 1 ]; then
    if [ $((flood_ok * 100)) -gt $((LIMIT * 102)) ] || [ $((flood_ok * 100)) -lt $((LIMIT * 95)) ] || [ "$flood_other" -gt 0 ]; then
      echo "FAIL x$n: the flooding key admitted $flood_ok (95 % of $LIMIT .. $LIMIT + 2 %), $flood_other other"
      failed=1
    fi
    if [ "$c_ok" != - ] && { [ $((c_ok * 100)) -lt $(((c_ok + c_limited + c_other) * 99)) ] || [ "$c_other" -gt 0 ]; }; then
      echo "FAIL x$n: the clients got $c_ok of $((c_ok + c_limited + c_other)) admitted (99 %)"
      failed=1
    fi
  fi
  stop_all_servers
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$failed"
