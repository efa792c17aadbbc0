# syntax=docker/dockerfile:1
#
# Container image of CoreDNS with the dotforward plugin, built like CoreDNS's own
# image: a static Go binary on a distroless, non-root base.
#
#   docker build -t dotforward/coredns:dev .
#   docker run --rm -p 1053:53/udp -p 1053:53/tcp \
#     -v "$PWD/Corefile:/etc/coredns/Corefile:ro" dotforward/coredns:dev
#
# The Corefile must listen on the container's addresses (e.g. ".:53"), not on
# 127.0.0.1 as Corefile.example does for a local run.
#
# See deploy/README.md for Kubernetes.

ARG GO_IMAGE=golang:1.26-bookworm
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS build
# setcap lets the non-root user bind port 53 without running as root.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libcap2-bin \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Modules first, so that source edits do not invalidate the download layer.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w" -o /coredns ./cmd/coredns
RUN setcap cap_net_bind_service=+ep /coredns

# static-debian12 carries the Mozilla CA bundle (/etc/ssl/certs), which verifies
# public DoT resolvers; private CAs are mounted and named with the `tls` option.
FROM ${BASE_IMAGE}
COPY --from=build /coredns /coredns
USER nonroot:nonroot
EXPOSE 53/udp 53/tcp 9153/tcp
ENTRYPOINT ["/coredns"]
CMD ["-conf", "/etc/coredns/Corefile"]
