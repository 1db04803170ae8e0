#!/usr/bin/env bash
# Writes the generated references: docs/reference/{flags,annotations,metrics}.md from the code
# and charts/runpod-kubelet/README.md from values.yaml (src/reference/; its tests fail when a
# committed file is out of step).
set -euo pipefail
cd "$(dirname "$0")/.."
UPDATE_REFERENCE=1 cargo test --quiet --bin runpod-kubelet reference:: >/dev/null
git status --short docs/reference charts/runpod-kubelet/README.md
