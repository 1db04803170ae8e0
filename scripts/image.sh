#!/usr/bin/env bash
# Builds the runpod-kubelet image from ./Dockerfile with Debian's buildah (daemonless; vfs
# storage and chroot isolation work inside an unprivileged container too).
#
#   scripts/image.sh [TAG]          build the static binary (without the simulators) and the
#                                   image (default tag runpod-kubelet:dev); prints the tag
#   IMAGE_STORAGE=DIR               buildah storage root (default: buildah's own)
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-runpod-kubelet:dev}
target=x86_64-unknown-linux-gnu

command -v buildah >/dev/null || {
  echo "[image] installing buildah" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah >/dev/null
}

echo "[image] cargo build --release (static glibc)" >&2
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --quiet --release --target "$target" --bin runpod-kubelet --no-default-features
binary="target/$target/release/runpod-kubelet"
if ! ldd "$binary" 2>&1 | grep -qE "statically linked|not a dynamic executable"; then
  echo "[image] $binary is not static" >&2
  exit 1
fi

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp Dockerfile "$context/"
cp "$binary" "$context/runpod-kubelet"
strip "$context/runpod-kubelet" 2>/dev/null || true

storage=(--storage-driver vfs)
[[ -n ${IMAGE_STORAGE:-} ]] && storage+=(--root "$IMAGE_STORAGE" --runroot "$IMAGE_STORAGE/run")
buildah "${storage[@]}" bud --quiet --isolation chroot --tag "$tag" "$context" >&2
echo "$tag"
