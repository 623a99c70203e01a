#!/usr/bin/env bash
# The whole test suite (PR tier), from a fresh machine: installs what the tests need, then runs them.
#   bash scripts/test.sh            # PR tier
#   TOLLGATE_SCALE=100 PROPTEST_CASES=10000 bash scripts/test.sh   # the longer tier (see RELIABILITY.md)
set -euo pipefail
cd "$(dirname "$0")/.."

need_redis() { ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; }
if need_redis; then
  echo "installing redis-server (Debian package) for the Redis tests"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
# redis-sentinel for the Sentinel failover test (tests fall back to `redis-server --sentinel`).
if ! command -v redis-sentinel >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-sentinel >/dev/null
fi
# openssl makes the CA and certificates of the Redis TLS tests at test time.
if ! command -v openssl >/dev/null 2>&1; then
  echo "installing openssl (Debian package) for the Redis TLS tests"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openssl >/dev/null
fi
# The package starts no server we rely on: every Redis test starts its own on a free port.
need_chromium() { ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; }
if need_chromium; then
  echo "installing chromium and chromium-driver (Debian packages) for the playground's browser test"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
fi

export RUST_BACKTRACE=1
cargo test --all-features "$@"
# Arithmetic must agree with overflow checks off too.
if [ -f tests/core/time_and_numbers.rs ]; then
  cargo test --release --all-features --test core time_and_numbers
fi
