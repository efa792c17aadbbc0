package dot

import "iter"

// callSlots is the number of slots of a connection's call table: twice the
// default MaxInflight, so that calls with IDs given in turn rarely meet in a
// slot unless one is held long (a slow answer, a tombstone).
const callSlots = 256

// callTable is a connection's live calls and tombstones by ID (conn.calls). The
// conn gives IDs in turn (conn.nextID), so the outstanding ones are mostly
// consecutive: each goes in slot id%callSlots, a load and a compare where a map
// (written by both the caller's and the reader's processor) hashes; a call whose
// slot another holds goes in a map. A call's id is set before it enters a table
// and not changed while it is in one (see registerWithin). Every method needs
// the conn's mu, as the map did.
type callTable struct {
	slots [callSlots]*call
	over  map[uint16]*call // calls whose slot another call held when they came; nil while none has
	n     int              // calls in slots and over
}

// get returns the call with ID id, or nil.
func (t *callTable) get(id uint16) *call {
	if cl := t.slots[id%callSlots]; cl != nil && cl.id == id {
		return cl
	}
	return t.over[id] // nil from a nil map
}

// put adds cl under cl.id, which no call in t has.
func (t *callTable) put(cl *call) {
	t.n++
	if s := &t.slots[cl.id%callSlots]; *s == nil {
		*s = cl
		return
	}
	if t.over == nil {
		t.over = make(map[uint16]*call)
	}
	t.over[cl.id] = cl
}

// remove deletes the call with ID id, if t has one.
func (t *callTable) remove(id uint16) {
	if s := &t.slots[id%callSlots]; *s != nil && (*s).id == id {
		*s = nil
		t.n--
		return
	}
	if _, ok := t.over[id]; ok {
		delete(t.over, id)
		t.n--
	}
}

// len returns the number of calls in t.
func (t *callTable) len() int { return t.n }

// all yields every call in t; the loop may remove the call it is given.
func (t *callTable) all() iter.Seq[*call] {
	return func(yield func(*call) bool) {
		if t.n == 0 {
			return // an idle connection's sweep skips the slots
		}
		for i := range t.slots { // not a copy of the array: the loop may remove calls
			if cl := t.slots[i]; cl != nil && !yield(cl) {
				return
			}
		}
		for _, cl := range t.over {
			if !yield(cl) {
				return
			}
		}
	}
}

// clear removes every call.
func (t *callTable) clear() {
	clear(t.slots[:])
	clear(t.over)
	t.n = 0
}
