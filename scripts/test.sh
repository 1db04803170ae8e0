#!/usr/bin/env bash
# Runs every check and test: formatting, clippy, unit, integration, property-based fuzzing,
# the end-to-end tests against a real control plane, and a cargo-fuzz smoke run.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/prerequisites.sh

# Incremental artefacts double the size of a test build and help only an edit-compile loop.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

echo "== format and lint"
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "== unit, integration and end-to-end tests (test binaries side by side: TEST_JOBS, default 3)"
python3 scripts/run_tests.py
cargo test --workspace --doc --quiet

echo "== fuzz smoke (${FUZZ_SECONDS:-30}s)"
bash scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
