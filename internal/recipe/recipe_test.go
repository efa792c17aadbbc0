package recipe

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	content := "# comment\n\nIMAGE_LDFLAGS = -s -w\nIMAGE_USER=65532:65532\n"
	if err := os.WriteFile(filepath.Join(dir, File), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := r.Get("IMAGE_LDFLAGS"); err != nil || v != "-s -w" {
		t.Errorf("IMAGE_LDFLAGS = %q (%v), want \"-s -w\"", v, err)
	}
	if v, _ := r.Get("IMAGE_USER"); v != "65532:65532" {
		t.Errorf("IMAGE_USER = %q, want 65532:65532", v)
	}
	if _, err := r.Get("IMAGE_TAG"); err == nil || !strings.Contains(err.Error(), "image.env has no IMAGE_TAG") {
		t.Errorf("Get of a missing name: %v, want an error naming it", err)
	}
}

func TestReadBadLine(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, File), []byte("IMAGE_TAG = dev\nIMAGE_USER 65532\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Read(dir)
	if err == nil || !strings.Contains(err.Error(), "image.env:2:") {
		t.Errorf("Read of a line without '=': %v, want an error naming line 2", err)
	}
}
