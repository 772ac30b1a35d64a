# syntax=docker/dockerfile:1
#
# trainyard images. One build stage compiles both binaries; each runtime stage
# is a separate target:
#
#   docker build --target operator      -t trainyard/operator:0.1.0 .
#   docker build --target device-plugin -t trainyard/device-plugin:0.1.0 .
#
# Both runtime images are distroless: no shell, no package manager, only the
# binary and the C runtime it links against (glibc, libgcc).

ARG RUST_IMAGE=rust:1.89-bookworm

FROM ${RUST_IMAGE} AS builder
WORKDIR /src
# The whole workspace is needed: Cargo resolves every member (operator,
# device-plugin, e2e) even when building two of them. .dockerignore keeps
# target/, .git/ and the chart out of the context.
COPY . .
# Cache mounts keep the registry and incremental artefacts between builds; the
# binaries are copied out in the same step because target/ is a cache, not a
# layer. No protoc is needed: the device plugin compiles its proto with protox.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release \
        --package trainyard-operator --bin trainyard-operator \
        --package trainyard-device-plugin --bin trainyard-device-plugin \
 && mkdir -p /out \
 && cp target/release/trainyard-operator target/release/trainyard-device-plugin /out/

# The operator only talks to the API server: it runs as the distroless
# "nonroot" user (uid 65532), matching the chart's runAsUser.
FROM gcr.io/distroless/cc-debian12:nonroot AS operator
LABEL org.opencontainers.image.title="trainyard-operator" \
      org.opencontainers.image.description="Reconciles TrainingJobs into preemption-tolerant GPU pods" \
      org.opencontainers.image.source="https://github.com/trainyard-dev/trainyard" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/trainyard-operator /usr/local/bin/trainyard-operator
USER 65532:65532
# 8080: /metrics, /healthz, /readyz; 8082: the progress channel (POST /v1/progress),
# as the chart's container ports.
EXPOSE 8080 8082
ENTRYPOINT ["/usr/local/bin/trainyard-operator"]
CMD ["run"]

# The device plugin creates its socket in the kubelet's root-owned
# device-plugin directory (/var/lib/kubelet/device-plugins, mode 0755), so it
# runs as uid 0: the root-capable distroless variant. The chart still drops
# every capability, forbids privilege escalation and mounts the root
# filesystem read-only.
FROM gcr.io/distroless/cc-debian12 AS device-plugin
LABEL org.opencontainers.image.title="trainyard-device-plugin" \
      org.opencontainers.image.description="Kubernetes device plugin for NVIDIA GPUs with NVLink-aware allocation" \
      org.opencontainers.image.source="https://github.com/trainyard-dev/trainyard" \
      org.opencontainers.image.licenses="Apache-2.0"
# Ask the NVIDIA container toolkit (when it is the node's runtime) to inject
# the GPUs and libnvidia-ml into this container; NVML is loaded at run time.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
COPY --from=builder /out/trainyard-device-plugin /usr/local/bin/trainyard-device-plugin
USER 0:0
EXPOSE 9400
ENTRYPOINT ["/usr/local/bin/trainyard-device-plugin"]
CMD ["run"]
