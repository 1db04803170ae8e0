#!/usr/bin/env bash
# Installs what the tests and the demo need on a fresh Debian machine, once (later runs are
# no-ops): system packages (buildah for the image test, npm and unzip for Helm, tinyproxy as the
# corporate egress proxy of the proxy e2e test, promtool from
# Debian's prometheus for the alert rules), cargo-fuzz,
# Helm 4 (scripts/helm.sh) and the Kubernetes 1.20.2 control plane binaries (built from
# Debian's source package); both cached under ~/.cache/runpod-kubelet.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[prerequisites] $*" >&2; }

missing=()
for tool in openssl curl python3 unzip npm buildah; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
# The forward proxy alone (tinyproxy-bin: no service to start).
command -v tinyproxy >/dev/null 2>&1 || missing+=(tinyproxy-bin)
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# OpenSSH's sshd reads the completion wrapper's sshd_config in a unit test (`sshd -T`): the
# config the wrapper writes must be one sshd accepts, and key-only. Nothing is started.
if [[ ! -x /usr/sbin/sshd ]]; then
  log "installing openssh-server (for sshd -T)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server >/dev/null
fi

# promtool checks and unit-tests the chart's alert rules; Debian ships it in `prometheus`.
if ! command -v promtool >/dev/null 2>&1; then
  log "installing prometheus (for promtool)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

if [[ "${WITH_FUZZ:-1}" == 1 ]] && ! command -v cargo-fuzz >/dev/null 2>&1; then
  log "installing cargo-fuzz"
  cargo install --locked --quiet cargo-fuzz
fi

bash tests/control-plane/cluster.sh install >/dev/null
bash scripts/helm.sh >/dev/null
