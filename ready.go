package dotforward

import "github.com/coredns/coredns/plugin/ready"

var _ ready.Readiness = (*DoTForward)(nil)

// Ready implements ready.Readiness. It reports true once OnStartup has started
// every upstream's pool, and of every dotforward line chained after this one
// (the ready plugin only sees the first instance of a server block). It does not
// go false while upstreams are down: a cluster's DNS pods must stay in service
// during an upstream outage to keep answering cluster-internal names.
func (f *DoTForward) Ready() bool {
	if !f.started.Load() {
		return false
	}
	if next, ok := f.Next.(*DoTForward); ok {
		return next.Ready()
	}
	return true
}
