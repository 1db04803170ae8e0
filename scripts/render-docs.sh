#!/usr/bin/env bash
# Writes the generated references: docs/reference/{flags,annotations,metrics}.md from the code,
# charts/runpod-kubelet/README.md from values.yaml (src/reference/) and docs/reference/rbac.md
# from the rendered chart (tests/chart.rs); their tests fail when a committed file is out of step.
set -euo pipefail
cd "$(dirname "$0")/.."
UPDATE_REFERENCE=1 cargo test --quiet --bin runpod-kubelet reference:: >/dev/null
UPDATE_REFERENCE=1 cargo test --quiet --test chart the_rbac_reference_is_the_rendered_charts >/dev/null
git status --short docs/reference charts/runpod-kubelet/README.md
