package recipe

import "testing"

// Must is a Recipe read for a test: reading it or looking a name up fails the
// test instead of returning an error. The image tests of deploy/ and e2e/
// share it.
type Must struct{ Recipe }

// ReadMust reads image.env from dir, failing t if it cannot.
func ReadMust(t testing.TB, dir string) Must {
	t.Helper()
	r, err := Read(dir)
	if err != nil {
		t.Fatalf("Read image.env: %v", err)
	}
	return Must{r}
}

// Value returns the value of name, failing t if image.env lacks it.
func (r Must) Value(t testing.TB, name string) string {
	t.Helper()
	v, err := r.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
