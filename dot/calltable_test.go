package dot

import (
	"maps"
	"math/rand/v2"
	"testing"
)

// The call table answers as a map would, through calls meeting in a slot (IDs
// callSlots apart), removals of the slot's holder while another waits in the
// overflow, and removals while the table is walked.
func TestCallTableLikeAMap(t *testing.T) {
	var tab callTable
	want := map[uint16]*call{}
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(step int) {
		t.Helper()
		if tab.len() != len(want) {
			t.Fatalf("step %d: %d calls, want %d", step, tab.len(), len(want))
		}
		seen := map[uint16]*call{}
		for cl := range tab.all() {
			if seen[cl.id] != nil {
				t.Fatalf("step %d: ID %d walked twice", step, cl.id)
			}
			seen[cl.id] = cl
		}
		if !maps.Equal(seen, want) {
			t.Fatalf("step %d: walked %d calls, want %d", step, len(seen), len(want))
		}
	}
	for step := range 20000 {
		// IDs from a few slots' worth, so that they meet often.
		id := uint16(rng.IntN(8)) + uint16(rng.IntN(4))*callSlots
		if got := tab.get(id); got != want[id] {
			t.Fatalf("step %d: get(%d) = %p, want %p", step, id, got, want[id])
		}
		if want[id] == nil {
			cl := &call{id: id}
			tab.put(cl)
			want[id] = cl
		} else {
			tab.remove(id)
			delete(want, id)
		}
		check(step)
	}
	// Removing while walking, as the sweeper does.
	for cl := range tab.all() {
		if cl.id%2 == 0 {
			tab.remove(cl.id)
			delete(want, cl.id)
		}
	}
	check(-1)
	tab.clear()
	clear(want)
	check(-2)
}
