#!/usr/bin/env bash
# Fuzzes the admission review handler with libFuzzer for N seconds (default 30), starting from
# the seed reviews. cargo-fuzz wants nightly flags; RUSTC_BOOTSTRAP lets the stable toolchain,
# the only one on these machines, accept them.
set -euo pipefail
cd "$(dirname "$0")/../webhook/fuzz"
seconds="${1:-30}"
corpus="$(mktemp -d)"
trap 'rm -rf "$corpus"' EXIT
cp seeds/*.json "$corpus/"
# The dev profile: a third of the release build's CPU time (which was a quarter of CI's wall
# time) for a smoke run this short, with overflow checks on; a long run wants `--release`.
RUSTC_BOOTSTRAP=1 cargo fuzz run --dev review "$corpus" -- \
  -max_total_time="$seconds" -max_len=65536
