#!/usr/bin/env bash
# Regenerates the pictures in docs/img: the simulator's plots of the six strategies on the edge-attack
# trace (5 per 10 s, burst 5) and a screenshot of the playground (needs chromium and chromedriver,
# which scripts/test.sh installs).
#   bash scripts/plots.sh
set -euo pipefail
cd "$(dirname "$0")/.."

rm -rf docs/img/edge-attack
cargo run --quiet --example simulate -- --traffic edge-attack --quota 5/10s --burst 5 --out docs/img/edge-attack

cargo build --quiet --all-features --example playground
CI=true cargo test --quiet --all-features --test http playground_in_headless_chromium
cp target/playground/playground.png docs/img/playground.png
echo "wrote docs/img/edge-attack/*.svg, summary.md, decisions.csv and docs/img/playground.png"
