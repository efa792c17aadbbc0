// Package recipe reads image.env, the container image's recipe: what
// `make image` builds and the Dockerfile's ARGs repeat. The tests that check
// the image, the Dockerfile and the Kubernetes manifests against it share it.
package recipe

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// File is the recipe's name at the repository root.
const File = "image.env"

// Recipe maps each IMAGE_* name of image.env to its value.
type Recipe map[string]string

// Read parses root/image.env: make syntax, `NAME = value` lines and # comments.
func Read(root string) (Recipe, error) {
	path := filepath.Join(root, File)
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := Recipe{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("%s:%d: %q is not NAME = value", path, n, line)
		}
		r[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return r, sc.Err()
}

// Get returns the value of name, or an error naming the file if it has none.
func (r Recipe) Get(name string) (string, error) {
	if v := r[name]; v != "" {
		return v, nil
	}
	return "", fmt.Errorf("%s has no %s", File, name)
}
