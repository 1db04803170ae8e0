# The runpod-kubelet image: one static binary, nothing else (no shell, no libc, no package
# manager), run as a non-root user. The binary is built outside the image, because the build
# needs crates from the registry and a Rust toolchain that an image build here cannot fetch:
#
#   RUSTFLAGS="-C target-feature=+crt-static" \
#     cargo build --release --target x86_64-unknown-linux-gnu --bin runpod-kubelet \
#       --no-default-features   # no cloud simulators in a shipped binary
#
# scripts/image.sh does that, stages a build context holding only the binary, and builds this
# file with buildah (no daemon) or docker. TLS roots for RunPod are compiled in (webpki-roots).
FROM scratch
COPY --chmod=0555 runpod-kubelet /runpod-kubelet
# 65532: the conventional "nonroot" user; the chart runs it with runAsNonRoot and a read-only
# root filesystem.
USER 65532:65532
ENTRYPOINT ["/runpod-kubelet"]
