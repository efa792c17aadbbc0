package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/dotforward/dotforward/internal/recipe"
)

// imageRecipe is image.env, read for a test.
type imageRecipe = recipe.Must

func readRecipe(t testing.TB) imageRecipe { return recipe.ReadMust(t, "..") }

// dockerfile is the Dockerfile's instructions, continuation lines joined.
type dockerfile struct {
	globalArgs map[string]string // ARGs before the first FROM, with their defaults
	lines      []string          // every instruction, "KEYWORD rest"
}

func readDockerfile(t testing.TB) *dockerfile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatalf("Read Dockerfile: %v", err)
	}
	d := &dockerfile{globalArgs: map[string]string{}}
	var cur strings.Builder
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if rest, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(rest + " ")
			continue
		}
		cur.WriteString(line)
		d.add(cur.String())
		cur.Reset()
	}
	return d
}

// add records one instruction; ARG NAME=value before any FROM is global.
func (d *dockerfile) add(instr string) {
	d.lines = append(d.lines, instr)
	if slices.ContainsFunc(d.lines, func(l string) bool { return strings.HasPrefix(l, "FROM ") }) {
		return
	}
	if arg, ok := strings.CutPrefix(instr, "ARG "); ok {
		k, v, _ := strings.Cut(arg, "=")
		d.globalArgs[k] = strings.Trim(v, `"`)
	}
}

// final returns the instructions of the last stage with keyword.
func (d *dockerfile) final(keyword string) []string {
	last := 0
	for i, l := range d.lines {
		if strings.HasPrefix(l, "FROM ") {
			last = i
		}
	}
	var out []string
	for _, l := range d.lines[last:] {
		if rest, ok := strings.CutPrefix(l, keyword+" "); ok {
			out = append(out, rest)
		}
	}
	return out
}

// The values image.env and the Dockerfile's global ARGs must share.
var recipeArgs = []string{"IMAGE_GOFLAGS", "IMAGE_LDFLAGS", "IMAGE_CAPS", "IMAGE_USER", "IMAGE_CA_BUNDLE", "IMAGE_SOURCE"}

// imageLabels are the OCI labels both recipes set, each from its ARG.
var imageLabels = map[string]string{
	"org.opencontainers.image.source":   "IMAGE_SOURCE",
	"org.opencontainers.image.revision": "IMAGE_REVISION",
	"org.opencontainers.image.version":  "IMAGE_VERSION",
	"org.opencontainers.image.created":  "IMAGE_CREATED",
}

// TestImageRecipe checks that the Dockerfile builds what `make image` builds:
// the same ARG values as image.env, used in the same places (build flags,
// capability, user, files, labels, ports, entrypoint and command).
func TestImageRecipe(t *testing.T) {
	r, d := readRecipe(t), readDockerfile(t)
	for _, k := range recipeArgs {
		if got, want := d.globalArgs[k], r.Value(t, k); got != want {
			t.Errorf("Dockerfile: ARG %s=%q, image.env has %q", k, got, want)
		}
	}
	for k, v := range r.Recipe {
		if strings.ContainsAny(v, "\"'\\$`") {
			t.Errorf("image.env: %s = %s has a quote, backslash or $: scripts/image.sh takes the words as they are", k, v)
		}
	}
	checkDockerfileBuild(t, d)
	checkDockerfileFinal(t, r, d)
}

// checkDockerfileBuild: the build stage compiles and sets the capability with
// the recipe's ARGs, as scripts/image.sh does.
func checkDockerfileBuild(t *testing.T, d *dockerfile) {
	wants := []string{
		`CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build $IMAGE_GOFLAGS -ldflags "$IMAGE_LDFLAGS" -o /coredns ./cmd/coredns`,
		`setcap "$IMAGE_CAPS" /coredns`,
	}
	for _, want := range wants {
		if !slices.ContainsFunc(d.lines, func(l string) bool { return strings.Join(strings.Fields(l), " ") == "RUN "+want }) {
			t.Errorf("Dockerfile: no instruction RUN %s", want)
		}
	}
}

// checkDockerfileFinal: the final stage is scratch with the two files, the user,
// ports, entrypoint, command and labels of the recipe.
func checkDockerfileFinal(t *testing.T, r imageRecipe, d *dockerfile) {
	if got := d.final("FROM"); !slices.Equal(got, []string{"scratch"}) {
		t.Errorf("Dockerfile: the final stage is FROM %v, want scratch (make image builds from scratch)", got)
	}
	entry := r.Value(t, "IMAGE_ENTRYPOINT")
	wantCopy := []string{"--from=build /coredns " + entry, "--from=build ${IMAGE_CA_BUNDLE} ${IMAGE_CA_BUNDLE}"}
	if got := d.final("COPY"); !slices.Equal(got, wantCopy) {
		t.Errorf("Dockerfile: final stage COPY %q, want %q", got, wantCopy)
	}
	if got := d.final("USER"); !slices.Equal(got, []string{"${IMAGE_USER}"}) {
		t.Errorf("Dockerfile: USER %v, want ${IMAGE_USER}", got)
	}
	if got := d.final("EXPOSE"); !slices.Equal(got, []string{r.Value(t, "IMAGE_PORTS")}) {
		t.Errorf("Dockerfile: EXPOSE %v, image.env has %s", got, r.Value(t, "IMAGE_PORTS"))
	}
	checkJSONInstr(t, d, "ENTRYPOINT", []string{entry})
	checkJSONInstr(t, d, "CMD", strings.Fields(r.Value(t, "IMAGE_CMD")))
	var wantLabels []string
	for k, arg := range imageLabels {
		wantLabels = append(wantLabels, fmt.Sprintf("%s=${%s}", k, arg))
	}
	var gotLabels []string
	for _, l := range d.final("LABEL") {
		gotLabels = append(gotLabels, strings.Fields(l)...)
	}
	slices.Sort(wantLabels)
	slices.Sort(gotLabels)
	if !slices.Equal(gotLabels, wantLabels) {
		t.Errorf("Dockerfile: LABEL %q, want %q", gotLabels, wantLabels)
	}
}

// checkJSONInstr checks the exec form (a JSON array) of the final stage's keyword.
func checkJSONInstr(t *testing.T, d *dockerfile, keyword string, want []string) {
	got := d.final(keyword)
	var words []string
	if len(got) != 1 || json.Unmarshal([]byte(got[0]), &words) != nil || !slices.Equal(words, want) {
		t.Errorf("Dockerfile: %s %q, want %q from image.env", keyword, got, want)
	}
}

// TestImageRecipeUsed checks that every entry of image.env reaches the build:
// the Makefile exports it to scripts/image.sh, which uses it.
func TestImageRecipeUsed(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join("..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	exports := regexp.MustCompile(`(?m)^export ((?:.*\\\n)*.*)$`).FindSubmatch(mk)
	if exports == nil {
		t.Fatalf("Makefile: no export line")
	}
	exported := strings.Fields(strings.ReplaceAll(string(exports[1]), "\\", " "))
	script, err := os.ReadFile(filepath.Join("..", "scripts", "image.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for k := range readRecipe(t).Recipe {
		if !slices.Contains(exported, k) {
			t.Errorf("Makefile does not export %s (image.env) to scripts/image.sh", k)
		}
		if !strings.Contains(string(script), "$"+k) {
			t.Errorf("scripts/image.sh does not use %s (image.env)", k)
		}
	}
}
