package dotforward

import "github.com/coredns/coredns/plugin/ready"

var _ ready.Readiness = (*DoTForward)(nil)

// Ready implements ready.Readiness. It reports true once OnStartup has started
// every upstream's pool and the first round of health probes has finished (an
// upstream found down then is skipped from the first query on), and of every dotforward line chained after this one
// (the ready plugin only sees the first instance of a server block). It does not
// go false while upstreams are down: a cluster's DNS pods must stay in service
// during an upstream outage to keep answering cluster-internal names.
func (f *DoTForward) Ready() bool {
	if !f.started.Load() {
		return false
	}
	for _, u := range f.upstreams {
		if !u.probed() {
			return false
		}
	}
	if next, ok := f.Next.(*DoTForward); ok {
		return next.Ready()
	}
	return true
}
