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
# Release with parallel codegen: cargo-fuzz's default of one codegen unit doubles the build
# for a run this short.
RUSTC_BOOTSTRAP=1 cargo fuzz run --release --codegen-units 16 review "$corpus" -- \
  -max_total_time="$seconds" -max_len=65536
