# The runpod-kubelet image: one static binary, nothing else (no shell, no libc, no package
# manager), run as a non-root user.
#
#   docker build -t runpod-kubelet .        (or: buildah bud -t runpod-kubelet .)
#   docker buildx build --platform linux/amd64,linux/arm64 .   (what .github/workflows/release.yml runs)
#
# The builder stage compiles the binary from this checkout for the platform being built (statically
# linked glibc, no cloud simulators). scripts/image.sh, for machines that cannot pull a base
# image, builds the binary on the host and builds the final stage alone from it; tests/image.rs
# checks that its stage and the one below stay the same. TLS roots for the clouds are compiled
# in (webpki-roots); more come from --cloud-ca-file.
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    target="$(uname -m)-unknown-linux-gnu" \
 && RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --locked --release --target "$target" --bin runpod-kubelet --no-default-features \
 && mkdir -p /out \
 && cp "target/$target/release/runpod-kubelet" /out/runpod-kubelet \
 && strip /out/runpod-kubelet

# --- final stage (scripts/image.sh builds from here on, with the binary from the host) ---
FROM scratch
COPY --from=build --chmod=0555 /out/runpod-kubelet /runpod-kubelet
# 65532: the conventional "nonroot" user; the chart runs it with runAsNonRoot and a read-only
# root filesystem.
USER 65532:65532
ENTRYPOINT ["/runpod-kubelet"]
