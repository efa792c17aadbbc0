package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dotforward/dotforward/internal/recipe"
)

// imageRecipe is image.env, read for a test.
type imageRecipe = recipe.Must

func readRecipe(t testing.TB) imageRecipe { return recipe.ReadMust(t, "..") }

// imageArchs are the architectures the test builds; only the host's runs.
var imageArchs = []string{"amd64", "arm64"}

// imageBuildTimeout bounds one `make image` (two cross-compiled CoreDNS builds
// when the Go build cache is cold, on a loaded machine).
const imageBuildTimeout = 20 * time.Minute

// TestImage builds the container image with `make image` for amd64 and arm64,
// twice, and checks that both builds are the same bytes; then it checks each
// architecture's image (files, capability, user, labels, entrypoint), unpacks the
// host's with umoci and runs it: as the image's user, with only
// CAP_NET_BIND_SERVICE and no-new-privileges, in a private network namespace,
// serving the node-local Corefile on port 53 through dotforward to Unbound over
// DoT. Without the file capability the same run cannot bind port 53.
func TestImage(t *testing.T) {
	for _, name := range []string{"make", "buildah", "skopeo", "umoci", "getcap", "setpriv", "ip", "tar", "git"} {
		tool(t, name)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("the image test needs root (buildah's storage, setcap, network namespaces): run the tests as root (sudo make test)")
	}
	r := readRecipe(t)
	dir := t.TempDir()
	first, firstDigest := buildImage(t, filepath.Join(dir, "first.oci.tar"))
	second, secondDigest := buildImage(t, filepath.Join(dir, "second.oci.tar"))
	if firstDigest != secondDigest || fileSHA256(t, first) != fileSHA256(t, second) {
		t.Errorf("make image is not reproducible: digest %s, then %s; archive sha256 %s, then %s",
			firstDigest, secondDigest, fileSHA256(t, first), fileSHA256(t, second))
	}
	img := openImage(t, first)
	if img.digest != firstDigest {
		t.Errorf("make image printed digest %s, the archive's index names %s", firstDigest, img.digest)
	}
	want := wantImage(t, r)
	for _, arch := range imageArchs {
		t.Run(arch, func(t *testing.T) { checkImageArch(t, img, want, arch) })
	}
	bundle := unpackImage(t, first, r)
	runImage(t, bundle)
}

// buildImage runs `make image` for imageArchs into archive and returns the
// archive and the digest the build printed.
func buildImage(t *testing.T, archive string) (string, string) {
	t.Helper()
	out, err := run(t, imageBuildTimeout, tool(t, "make"), "-C", "..", "--no-print-directory", "image",
		"IMAGE_ARCHIVE="+archive, "IMAGE_ARCHS="+strings.Join(imageArchs, " "), "IMAGE_LOAD=no")
	if err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`digest (sha256:[0-9a-f]{64})`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("make image printed no digest:\n%s", out)
	}
	t.Logf("make image: %s", strings.TrimSpace(out[strings.LastIndex(out, "image: "):]))
	return archive, m[1]
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ociImage is an extracted OCI archive: the layout directory and its index.
type ociImage struct {
	dir    string
	digest string // the digest index.json names: the image index
	index  ociIndex
}

// openImage extracts archive and reads the image index it names.
func openImage(t *testing.T, archive string) *ociImage {
	t.Helper()
	img := &ociImage{dir: t.TempDir()}
	if out, err := run(t, time.Minute, tool(t, "tar"), "-xf", archive, "-C", img.dir); err != nil {
		t.Fatalf("tar -xf %s: %v\n%s", archive, err, out)
	}
	var top ociIndex
	img.readJSON(t, filepath.Join(img.dir, "index.json"), &top)
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != mediaTypeIndex {
		t.Fatalf("index.json: want one image index (multi-arch), got %+v", top.Manifests)
	}
	img.digest = top.Manifests[0].Digest
	img.readBlob(t, top.Manifests[0], &img.index)
	return img
}

func (img *ociImage) readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// blobPath returns the path of d's blob after checking its digest and size.
func (img *ociImage) blobPath(t *testing.T, d ociDescriptor) string {
	t.Helper()
	enc, ok := strings.CutPrefix(d.Digest, "sha256:")
	if !ok || strings.ContainsAny(enc, "/.") {
		t.Fatalf("descriptor digest %q is not sha256:HEX", d.Digest)
	}
	path := filepath.Join(img.dir, "blobs", "sha256", enc)
	if got := "sha256:" + fileSHA256(t, path); got != d.Digest {
		t.Fatalf("blob %s has digest %s", d.Digest, got)
	}
	if st, err := os.Stat(path); err != nil || st.Size() != d.Size {
		t.Fatalf("blob %s: size %v (%v), descriptor says %d", d.Digest, st, err, d.Size)
	}
	return path
}

func (img *ociImage) readBlob(t *testing.T, d ociDescriptor, v any) {
	t.Helper()
	img.readJSON(t, img.blobPath(t, d), v)
}

// imageWant is what every architecture's image must say, from image.env and git.
type imageWant struct {
	user, entrypoint, caBundle string
	cmd, ports                 []string
	labels                     map[string]string
	epoch                      time.Time
}

func wantImage(t *testing.T, r imageRecipe) imageWant {
	t.Helper()
	git := func(args ...string) string {
		out, err := run(t, time.Minute, tool(t, "git"), append([]string{"-C", ".."}, args...)...)
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(out)
	}
	secs, err := strconv.ParseInt(git("log", "-1", "--format=%ct"), 10, 64)
	if err != nil {
		t.Fatalf("git log: %v", err)
	}
	epoch := time.Unix(secs, 0).UTC()
	if r.Value(t, "IMAGE_CAPS") != "cap_net_bind_service=+ep" {
		t.Fatalf("image.env: IMAGE_CAPS = %s; this test checks cap_net_bind_service=+ep: update it", r.Recipe["IMAGE_CAPS"])
	}
	return imageWant{
		user:       r.Value(t, "IMAGE_USER"),
		entrypoint: r.Value(t, "IMAGE_ENTRYPOINT"),
		caBundle:   r.Value(t, "IMAGE_CA_BUNDLE"),
		cmd:        strings.Fields(r.Value(t, "IMAGE_CMD")),
		ports:      strings.Fields(r.Value(t, "IMAGE_PORTS")),
		labels: map[string]string{
			"org.opencontainers.image.source":   r.Value(t, "IMAGE_SOURCE"),
			"org.opencontainers.image.revision": git("rev-parse", "HEAD"),
			"org.opencontainers.image.version":  git("describe", "--tags", "--always", "--dirty"),
			"org.opencontainers.image.created":  epoch.Format(time.RFC3339),
		},
		epoch: epoch,
	}
}

// checkImageArch checks the image of arch in the index: its config and its one
// layer.
func checkImageArch(t *testing.T, img *ociImage, want imageWant, arch string) {
	var desc *ociDescriptor
	for i, d := range img.index.Manifests {
		if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == arch {
			desc = &img.index.Manifests[i]
		}
	}
	if desc == nil || desc.MediaType != mediaTypeManifest {
		t.Fatalf("the index has no linux/%s image manifest: %+v", arch, img.index.Manifests)
	}
	var m ociManifest
	img.readBlob(t, *desc, &m)
	var cfg ociImageConfig
	img.readBlob(t, m.Config, &cfg)
	checkImageConfig(t, cfg, want, arch)
	if len(m.Layers) != 1 {
		t.Fatalf("want one layer, got %d", len(m.Layers))
	}
	diffID := checkLayer(t, img, m.Layers[0], want, arch)
	if len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != diffID {
		t.Errorf("config's diff_ids %v, the layer is %s", cfg.RootFS.DiffIDs, diffID)
	}
}

func checkImageConfig(t *testing.T, cfg ociImageConfig, want imageWant, arch string) {
	t.Helper()
	if cfg.OS != "linux" || cfg.Architecture != arch {
		t.Errorf("config: %s/%s, want linux/%s", cfg.OS, cfg.Architecture, arch)
	}
	c := cfg.Config
	uid, _, _ := strings.Cut(c.User, ":")
	if c.User != want.user || uid == "0" || uid == "root" {
		t.Errorf("config: user %q, want %s (image.env's IMAGE_USER, not root)", c.User, want.user)
	}
	if !slices.Equal(c.Entrypoint, []string{want.entrypoint}) || !slices.Equal(c.Cmd, want.cmd) {
		t.Errorf("config: entrypoint %q cmd %q, want %q %q", c.Entrypoint, c.Cmd, want.entrypoint, want.cmd)
	}
	ports := slices.Sorted(func(yield func(string) bool) {
		for p := range c.ExposedPorts {
			if !yield(p) {
				return
			}
		}
	})
	if !slices.Equal(ports, slices.Sorted(slices.Values(want.ports))) {
		t.Errorf("config: exposed ports %v, want %v", ports, want.ports)
	}
	if fmt.Sprint(c.Labels) != fmt.Sprint(want.labels) {
		t.Errorf("config: labels %v, want %v", c.Labels, want.labels)
	}
	if cfg.Created == nil || !cfg.Created.Equal(want.epoch) || len(cfg.History) != 0 {
		t.Errorf("config: created %v with %d history entries, want %v (the commit's time) and none", cfg.Created, len(cfg.History), want.epoch)
	}
}

// capNetBindService is CAP_NET_BIND_SERVICE's bit (linux/capability.h).
const capNetBindService = 10

// elfMachines are the ELF e_machine values of the architectures built.
var elfMachines = map[string]uint16{"amd64": 62, "arm64": 183}

// checkLayer reads the layer's tar: exactly the binary and the CA bundle (and
// their directories), owned by root, stamped with the commit's time, the binary
// for arch with the file capability. It returns the uncompressed digest.
func checkLayer(t *testing.T, img *ociImage, d ociDescriptor, want imageWant, arch string) string {
	t.Helper()
	f, err := os.Open(img.blobPath(t, d))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rd io.Reader = f
	if strings.HasSuffix(d.MediaType, "+gzip") {
		if rd, err = gzip.NewReader(f); err != nil {
			t.Fatal(err)
		}
	}
	h := sha256.New()
	tr := tar.NewReader(io.TeeReader(rd, h))
	files := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("layer: %v", err)
		}
		name := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(hdr.Name, "./"), "/"), "/")
		files[name] = true
		checkLayerEntry(t, hdr, name, want)
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("layer: %s: %v", name, err)
		}
		switch "/" + name {
		case want.entrypoint:
			checkBinaryEntry(t, hdr, body, arch)
		case want.caBundle:
			if host, err := os.ReadFile(want.caBundle); err != nil || !bytes.Equal(body, host) {
				t.Errorf("layer: %s differs from the host's (%v)", name, err)
			}
		}
	}
	if _, err := io.Copy(h, rd); err != nil { // the tar's end padding
		t.Fatal(err)
	}
	wantFiles := []string{"etc", "etc/ssl", "etc/ssl/certs", strings.TrimPrefix(want.caBundle, "/"), strings.TrimPrefix(want.entrypoint, "/")}
	if got := slices.Sorted(func(yield func(string) bool) {
		for f := range files {
			if !yield(f) {
				return
			}
		}
	}); !slices.Equal(got, slices.Sorted(slices.Values(wantFiles))) {
		t.Errorf("layer holds %q, want %q", got, wantFiles)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// checkLayerEntry: owned by root, the commit's time, only the expected kinds.
func checkLayerEntry(t *testing.T, hdr *tar.Header, name string, want imageWant) {
	t.Helper()
	if hdr.Uid != 0 || hdr.Gid != 0 {
		t.Errorf("layer: %s owned by %d:%d, want root", name, hdr.Uid, hdr.Gid)
	}
	if !hdr.ModTime.Equal(want.epoch) {
		t.Errorf("layer: %s modified %v, want the commit's time %v", name, hdr.ModTime.UTC(), want.epoch)
	}
	wantMode := map[byte]int64{tar.TypeDir: 0o755, tar.TypeReg: 0o644}[hdr.Typeflag]
	if "/"+name == want.entrypoint {
		wantMode = 0o755
	}
	if wantMode == 0 || hdr.Mode&0o7777 != wantMode {
		t.Errorf("layer: %s type %q mode %o, want a directory or file with mode %o", name, hdr.Typeflag, hdr.Mode, wantMode)
	}
}

// checkBinaryEntry: an ELF for arch, with the file capability
// cap_net_bind_service=ep as a version 2 security.capability attribute (version
// 3 would tie it to the user namespace it was set in).
func checkBinaryEntry(t *testing.T, hdr *tar.Header, body []byte, arch string) {
	t.Helper()
	if len(body) < 20 || string(body[:4]) != "\x7fELF" || binary.LittleEndian.Uint16(body[18:20]) != elfMachines[arch] {
		t.Errorf("layer: the binary is not an ELF for %s", arch)
	}
	raw, ok := hdr.PAXRecords["SCHILY.xattr.security.capability"]
	if !ok {
		t.Fatalf("layer: the binary has no security.capability attribute: the file capability was lost (PAX records %v)", hdr.PAXRecords)
	}
	b := []byte(raw)
	if len(b) != 20 {
		t.Fatalf("layer: security.capability has %d bytes, want 20 (version 2)", len(b))
	}
	magic := binary.LittleEndian.Uint32(b[0:])
	permitted := uint64(binary.LittleEndian.Uint32(b[4:])) | uint64(binary.LittleEndian.Uint32(b[12:]))<<32
	inheritable := uint64(binary.LittleEndian.Uint32(b[8:])) | uint64(binary.LittleEndian.Uint32(b[16:]))<<32
	const v2, effective = 0x02000000, 0x1
	if magic != v2|effective || permitted != 1<<capNetBindService || inheritable != 0 {
		t.Errorf("layer: security.capability magic %#x permitted %#x inheritable %#x, want %#x %#x 0 (cap_net_bind_service=ep)",
			magic, permitted, inheritable, v2|effective, uint64(1)<<capNetBindService)
	}
}
