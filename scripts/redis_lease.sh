#!/usr/bin/env bash
# Quota leasing against the plain Redis store on one throw-away redis-server on a free port: one
# hot key (decisions/s, medians of alternating rounds), two instances against a limit of 1000, and
# a cold key over 4 instances (tools/src/bin/redis_lease.rs).
# Usage: scripts/redis_lease.sh [seconds-per-run] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-2}"
ROUNDS="${2:-5}"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
DIR=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" --daemonize no >/dev/null &
PID=$!
trap 'kill "$PID" 2>/dev/null; rm -rf "$DIR"' EXIT
until redis-cli -p "$PORT" PING >/dev/null 2>&1; do sleep 0.05; done
cargo build --release -p tollgate-tools --features redis --bin redis_lease
target/release/redis_lease "redis://127.0.0.1:$PORT" "$SECS" "$ROUNDS"
