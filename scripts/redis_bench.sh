#!/usr/bin/env bash
# Decisions/s through the Redis store (64 in flight) vs a plain EVALSHA loop of the same script
# (interleaved rounds, medians), and redis-benchmark -c 64 of that script, all against a throw-away
# redis-server on a free port.
# Usage: scripts/redis_bench.sh [seconds-per-run] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-5}"
ROUNDS="${2:-5}"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
DIR=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" --daemonize no >/dev/null &
PID=$!
trap 'kill "$PID" 2>/dev/null; rm -rf "$DIR"' EXIT
until redis-cli -p "$PORT" PING >/dev/null 2>&1; do sleep 0.05; done
cargo build --release -p tollgate-tools --features redis --bin redis_bench
OUT=$(target/release/redis_bench "redis://127.0.0.1:$PORT" "$SECS" "$ROUNDS")
echo "$OUT"
SHA=$(echo "$OUT" | awk '/^sha /{print $2}')
echo "redis-benchmark -c 64 EVALSHA (same script, random keys):"
redis-benchmark -p "$PORT" -c 64 -n 50000 -r 10000 -q \
  EVALSHA "$SHA" 1 "tollgate:{k__rand_int__}:g" 0 1 0 2000 0 1 1000 1000000 1000 1000 | tr "\r" "\n" | tail -1
