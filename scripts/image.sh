#!/usr/bin/env bash
# image.sh builds the container image as an OCI archive, without a container
# daemon or a registry: buildah from scratch, with vfs storage in a temporary
# directory. Run it through `make image`, which passes the recipe (image.env) in
# the environment. The Dockerfile declares the same recipe for `docker build`.
#
# The image holds two files: the static CoreDNS with dotforward, built as the
# Dockerfile builds it and given the file capability IMAGE_CAPS, and the CA
# bundle. It runs as IMAGE_USER and carries the OCI labels source, revision,
# version and created.
#
# Reproducible: one commit gives the same image digest and the same archive
# bytes. Every time in the image is SOURCE_DATE_EPOCH (the commit's time unless
# set), the history is omitted, buildah adds no label of its own, and the archive
# is a tar with sorted names, fixed owners and times (the layers' gzip is
# deterministic too: two builds were compared byte for byte).
#
# Environment, besides image.env's IMAGE_*:
#   IMAGE_ARCHS    architectures (GOARCH), default the host's; the archive
#                  holds an OCI image index of their images
#   IMAGE_ARCHIVE  the archive to write, default _output/dotforward-image.oci.tar
#   IMAGE_LOAD     auto (default): load the archive into docker or podman when
#                  there is one; no: do not
# Needs root (setcap, buildah's vfs storage), buildah, skopeo, setcap, go, git.
set -euo pipefail

die() {
	echo "image: $*" >&2
	exit 1
}

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

for v in IMAGE_NAME IMAGE_TAG IMAGE_SOURCE IMAGE_GOFLAGS IMAGE_LDFLAGS IMAGE_CAPS IMAGE_USER IMAGE_CA_BUNDLE IMAGE_PORTS IMAGE_ENTRYPOINT IMAGE_CMD; do
	[[ -n ${!v:-} ]] || die "$v is not set: run this through 'make image', which reads image.env"
done
for tool in buildah skopeo setcap go git tar; do
	command -v "$tool" >/dev/null || die "$tool is missing: run scripts/install-deps.sh"
done
[[ $(id -u) -eq 0 ]] || die "run as root (sudo make image): setcap and buildah's vfs storage need it"
[[ -r $IMAGE_CA_BUNDLE ]] || die "$IMAGE_CA_BUNDLE is missing: install ca-certificates"

archs=${IMAGE_ARCHS:-$(go env GOARCH)}
archive=${IMAGE_ARCHIVE:-_output/dotforward-image.oci.tar}
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
revision=${IMAGE_REVISION:-$(git rev-parse HEAD)}
version=${IMAGE_VERSION:-$(git describe --tags --always --dirty)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

work=$(mktemp -d)
bah=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
cleanup() {
	"${bah[@]}" rm --all >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

# json prints its arguments as a JSON array of strings (the recipe's words have
# no quotes or backslashes; deploy/recipe_test.go checks that).
json() {
	local out="" w
	for w in "$@"; do out+="${out:+,}\"$w\""; done
	echo "[$out]"
}

# build ARCH: builds the binary for ARCH and commits its image to the temporary
# storage as localhost/IMAGE_NAME:IMAGE_TAG-ARCH.
build() {
	local arch=$1 bin=$work/$1/coredns c
	# shellcheck disable=SC2086 # IMAGE_GOFLAGS is a list of flags
	CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build $IMAGE_GOFLAGS -ldflags "$IMAGE_LDFLAGS" -o "$bin" ./cmd/coredns
	setcap "$IMAGE_CAPS" "$bin"
	c=$("${bah[@]}" from --arch "$arch" --os linux scratch)
	# buildah copy keeps the security.capability attribute (as root); the test
	# reads it back from the layer's tar header.
	"${bah[@]}" copy --quiet --chmod 0755 "$c" "$bin" "$IMAGE_ENTRYPOINT"
	"${bah[@]}" copy --quiet --chmod 0644 "$c" "$work/ca-bundle.crt" "$IMAGE_CA_BUNDLE"
	# shellcheck disable=SC2086 # IMAGE_CMD is a list of words
	local config=(--arch "$arch" --os linux --user "$IMAGE_USER"
		--entrypoint "$(json "$IMAGE_ENTRYPOINT")"
		--cmd "$(json $IMAGE_CMD)"
		--label "org.opencontainers.image.source=$IMAGE_SOURCE"
		--label "org.opencontainers.image.revision=$revision"
		--label "org.opencontainers.image.version=$version"
		--label "org.opencontainers.image.created=$created")
	local port
	for port in $IMAGE_PORTS; do config+=(--port "$port"); done
	"${bah[@]}" config "${config[@]}" "$c"
	"${bah[@]}" commit --quiet --rm --timestamp "$epoch" --omit-history --identity-label=false \
		"$c" "localhost/$IMAGE_NAME:$IMAGE_TAG-$arch" >/dev/null
}

install -m 0644 "$IMAGE_CA_BUNDLE" "$work/ca-bundle.crt"
read -r -a archlist <<<"$archs"
for arch in "${archlist[@]}"; do
	build "$arch"
done

# An image index of the architectures (one or more), as registries hold
# multi-arch images; skopeo and container engines pick the host's image from it.
layout=$work/layout
list=localhost/$IMAGE_NAME:$IMAGE_TAG
"${bah[@]}" manifest create "$list" >/dev/null
for arch in "${archlist[@]}"; do
	"${bah[@]}" manifest add "$list" "containers-storage:localhost/$IMAGE_NAME:$IMAGE_TAG-$arch" >/dev/null
done
"${bah[@]}" manifest push --quiet --all "$list" "oci:$layout:$IMAGE_TAG"

# The archive of the OCI layout, the same bytes for the same content.
mkdir -p "$(dirname "$archive")"
tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
	--format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
	-C "$layout" -cf "$archive.tmp" .
mv "$archive.tmp" "$archive"

digest=sha256:$(skopeo inspect --raw "oci-archive:$archive" | sha256sum | cut -d' ' -f1)
echo "image: $archive ($IMAGE_NAME:$IMAGE_TAG, $archs, $(stat -c %s "$archive") bytes): digest $digest"

# Load it where a container engine will find it: docker's daemon, or podman's
# storage (containers-storage, no daemon). skopeo picks the host's platform.
if [[ ${IMAGE_LOAD:-auto} == auto ]]; then
	if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
		skopeo copy --quiet "oci-archive:$archive" "docker-daemon:$IMAGE_NAME:$IMAGE_TAG"
		echo "image: loaded into docker as $IMAGE_NAME:$IMAGE_TAG"
	elif command -v podman >/dev/null; then
		skopeo copy --quiet "oci-archive:$archive" "containers-storage:localhost/$IMAGE_NAME:$IMAGE_TAG"
		echo "image: loaded into podman's storage as localhost/$IMAGE_NAME:$IMAGE_TAG"
	fi
fi
