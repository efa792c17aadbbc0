# syntax=docker/dockerfile:1
#
# Container image of CoreDNS with the dotforward plugin, built like CoreDNS's own
# image: a static Go binary and a CA bundle on an empty base, run as a non-root
# user.
#
#   docker build -t dotforward/coredns:dev \
#     --build-arg IMAGE_REVISION=$(git rev-parse HEAD) \
#     --build-arg IMAGE_VERSION=$(git describe --tags --always --dirty) \
#     --build-arg IMAGE_CREATED=$(date -u -d @$(git log -1 --format=%ct) +%Y-%m-%dT%H:%M:%SZ) .
#   docker run --rm -p 1053:53/udp -p 1053:53/tcp \
#     -v "$PWD/Corefile:/etc/coredns/Corefile:ro" dotforward/coredns:dev
#
# Without a container engine, `make image` builds the same image (see
# scripts/image.sh). Both follow one recipe, image.env: the IMAGE_* ARGs below
# repeat its values, and e2e/image_test.go fails when they differ, or when the
# ENTRYPOINT, CMD, EXPOSE, USER, COPY or LABEL lines do not use them.
#
# The Corefile must listen on the container's addresses (e.g. ".:53"), not on
# 127.0.0.1 as Corefile.example does for a local run.
#
# See deploy/README.md for Kubernetes.

ARG GO_IMAGE=golang:1.26-bookworm
ARG IMAGE_GOFLAGS=-trimpath
ARG IMAGE_LDFLAGS="-s -w"
ARG IMAGE_CAPS=cap_net_bind_service=+ep
ARG IMAGE_USER=65532:65532
ARG IMAGE_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
ARG IMAGE_SOURCE=https://github.com/dotforward/dotforward
ARG IMAGE_REVISION=unknown
ARG IMAGE_VERSION=dev
ARG IMAGE_CREATED=1970-01-01T00:00:00Z

FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS build
# setcap lets the non-root user bind port 53 without running as root;
# ca-certificates is the bundle the image carries.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libcap2-bin ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Modules first, so that source edits do not invalidate the download layer.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
ARG IMAGE_GOFLAGS
ARG IMAGE_LDFLAGS
ARG IMAGE_CAPS
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build $IMAGE_GOFLAGS -ldflags "$IMAGE_LDFLAGS" -o /coredns ./cmd/coredns
RUN setcap "$IMAGE_CAPS" /coredns

# The Mozilla CA bundle verifies public DoT resolvers; private CAs are mounted
# and named with the `tls` option.
FROM scratch
ARG IMAGE_USER
ARG IMAGE_CA_BUNDLE
ARG IMAGE_SOURCE
ARG IMAGE_REVISION
ARG IMAGE_VERSION
ARG IMAGE_CREATED
COPY --from=build /coredns /coredns
COPY --from=build ${IMAGE_CA_BUNDLE} ${IMAGE_CA_BUNDLE}
LABEL org.opencontainers.image.source=${IMAGE_SOURCE} \
      org.opencontainers.image.revision=${IMAGE_REVISION} \
      org.opencontainers.image.version=${IMAGE_VERSION} \
      org.opencontainers.image.created=${IMAGE_CREATED}
USER ${IMAGE_USER}
EXPOSE 53/udp 53/tcp 9153/tcp
ENTRYPOINT ["/coredns"]
CMD ["-conf", "/etc/coredns/Corefile"]
