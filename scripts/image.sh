#!/usr/bin/env bash
# Builds the runpod-kubelet image with Debian's buildah (daemonless; vfs storage and chroot
# isolation work inside an unprivileged container too), where no base image can be pulled: the
# static binary is built on this machine and only the Dockerfile's final stage runs, its
# `COPY --from=build` reading the binary from the build context instead (tests/image.rs checks
# the two stay the same). Anywhere else, `docker build .` builds the same image from source.
#
#   scripts/image.sh [TAG]          build the static binary (without the simulators) and the
#                                   image (default tag runpod-kubelet:dev); prints the tag
#   scripts/image.sh --final-stage  print the Dockerfile this script builds, and nothing else
#   IMAGE_STORAGE=DIR               buildah storage root (default: buildah's own)
#   IMAGE_PROFILE=PROFILE           cargo profile of the binary (default release; tests/image.rs
#                                   builds `dev`: it checks the image's make-up, not the optimiser)
set -euo pipefail
cd "$(dirname "$0")/.."

# The Dockerfile from its final stage on, the binary copied from the context.
final_stage() {
  awk '/^FROM scratch/ { on = 1 } on' Dockerfile |
    sed 's|^COPY --from=build --chmod=0555 /out/runpod-kubelet |COPY --chmod=0555 runpod-kubelet |'
}
if [[ ${1:-} == --final-stage ]]; then
  final_stage
  exit 0
fi
if ! final_stage | grep -q '^COPY --chmod=0555 runpod-kubelet /runpod-kubelet$'; then
  echo "[image] Dockerfile: no 'FROM scratch' stage copying /out/runpod-kubelet from build" >&2
  exit 1
fi
tag=${1:-runpod-kubelet:dev}
target=x86_64-unknown-linux-gnu

command -v buildah >/dev/null || {
  echo "[image] installing buildah" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah >/dev/null
}

profile=${IMAGE_PROFILE:-release}
echo "[image] cargo build --profile $profile (static glibc)" >&2
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --quiet --profile "$profile" --target "$target" --bin runpod-kubelet --no-default-features
# Cargo's `dev` profile builds into `debug/`.
binary="target/$target/$([[ $profile == dev ]] && echo debug || echo "$profile")/runpod-kubelet"
if ! ldd "$binary" 2>&1 | grep -qE "statically linked|not a dynamic executable"; then
  echo "[image] $binary is not static" >&2
  exit 1
fi

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
final_stage >"$context/Dockerfile"
cp "$binary" "$context/runpod-kubelet"
strip "$context/runpod-kubelet" 2>/dev/null || true

storage=(--storage-driver vfs)
[[ -n ${IMAGE_STORAGE:-} ]] && storage+=(--root "$IMAGE_STORAGE" --runroot "$IMAGE_STORAGE/run")
buildah "${storage[@]}" bud --quiet --isolation chroot --tag "$tag" "$context" >&2
echo "$tag"
