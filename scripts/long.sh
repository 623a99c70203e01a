#!/usr/bin/env bash
# The longer tier in one documented command (CONTRIBUTING.md "Test tiers"):
#
#   bash scripts/long.sh
#
# Knobs (environment): TOLLGATE_SCALE (default 10: the issue's full sizes, e.g. 2 x 5*10^5 and
# 8 x 5*10^5 attempts in the concurrency tests, 10^6-key floods in the memory-store tests; 100 gives
# the 10^7-key flood there), PROPTEST_CASES (default 10000 cases per proptest), FLOOD_KEYS (default 10^7,
# the keys of tools/src/bin/key_flood.rs), FUZZ (default 1: run scripts/fuzz.sh when it exists).
# Needs redis-server/redis-cli on PATH (scripts/test.sh installs them); the Redis tests start their own.
# See RELIABILITY.md for what each step proves and the figures it printed last time.
set -euo pipefail
cd "$(dirname "$0")/.."

export TOLLGATE_SCALE="${TOLLGATE_SCALE:-10}"
export PROPTEST_CASES="${PROPTEST_CASES:-10000}"
export RUST_BACKTRACE=1
export CI="${CI:-true}" # a missing redis-server fails the Redis tests instead of skipping them
FLOOD_KEYS="${FLOOD_KEYS:-10000000}"

step() { printf '\n=== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

step "whole suite, release, TOLLGATE_SCALE=$TOLLGATE_SCALE PROPTEST_CASES=$PROPTEST_CASES"
cargo build --release --all-features --examples
cargo test --release --all-features -- --nocapture

step "key churn at a cap of 100,000: floods of 20x to 60x the cap, new keys admitted and a spent key's budget kept"
TOLLGATE_KEY_CAP=100000 cargo test --release --all-features --test core key_cap::after_ -- --nocapture

step "Redis flood over HTTP: the server example (release) under wrk, 2000 connections x 5 s, every strategy, one and two instances"
CHECK=1 bash scripts/redis_http_flood.sh

step "Fair shedding over HTTP: one key flooded by 2000 connections while 20 clients send 5 req/s each, 10 s, one and two instances"
CHECK=1 BUILD=0 bash scripts/redis_fairness.sh

step "time and numbers with overflow checks on (test profile), at the scaled case count"
cargo test --all-features --test core time_and_numbers

step "time and numbers with overflow checks off (release): debug and release must agree"
cargo test --release --all-features --test core time_and_numbers

step "key flood: $FLOOD_KEYS distinct keys, capped at 10^6 then uncapped, VmRSS printed"
cargo run --release -p tollgate-tools --bin key_flood -- --keys "$FLOOD_KEYS"

if [ "${FUZZ:-1}" = 1 ] && [ -f scripts/fuzz.sh ]; then
  step "cargo-fuzz (scripts/fuzz.sh)"
  bash scripts/fuzz.sh
else
  step "fuzzing skipped: scripts/fuzz.sh is absent (or FUZZ=0); the proptest harnesses ran above"
fi

# The model checkers build the crate with a cfg of their own, in target dirs of their own so that the
# normal build cache is kept. `--cfg tollgate_loom`, not `--cfg loom`: RUSTFLAGS reach every crate,
# and tokio drops `tokio::net` under `cfg(loom)`, breaking the dev-dependencies.
step "loom: every interleaving of 2 threads x 2 checks on one packed cell, 4 layouts"
RUSTFLAGS="--cfg tollgate_loom" CARGO_TARGET_DIR=target/loom \
  cargo test --release --lib memory::model:: -- --nocapture

step "shuttle: clock advancer + 2 consumers, 1000 random and 1000 PCT schedules per layout"
RUSTFLAGS="--cfg shuttle" CARGO_TARGET_DIR=target/shuttle \
  cargo test --release --lib memory::model:: -- --nocapture

step "two threads against one at 10^6 keys, every strategy: at least 1.2x one thread's rate (needs the 2 CPUs to itself)"
bash scripts/two_threads.sh

step "cargo deny: licences, bans and sources of every dependency (deny.toml; advisories need the network)"
command -v cargo-deny >/dev/null || cargo install cargo-deny --locked
cargo deny --all-features check licenses bans sources

# What crates.io would get: the packaged crate must carry everything its tests need (the include list
# in Cargo.toml). Unpacked outside the repository so that nothing of the checkout can stand in for a
# missing file; built in the checkout's target dir, so the dependencies are not built again.
step "the packaged crate: cargo package, then its tests in the unpacked copy"
cargo package --allow-dirty --no-verify
# Every file the README links or shows (relative paths) is in the package.
listed=$(cargo package --allow-dirty --list)
for f in $(grep -oE '\]\([^)#:]+\)' README.md | sed -E 's/^\]\((.*)\)$/\1/' | sort -u); do
  grep -qxF "$f" <<<"$listed" || { echo "README shows $f, which the package leaves out" >&2; exit 1; }
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
root=$PWD
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
tar -xzf "target/package/tollgate-$version.crate" -C "$unpacked"
(cd "$unpacked/tollgate-$version" && CARGO_TARGET_DIR="$root/target" cargo test --all-features)

step "done"
