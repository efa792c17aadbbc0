// Package dotforward is a CoreDNS plugin that forwards queries to upstream
// resolvers over DNS-over-TLS (RFC 7858), through pipelined, health-checked
// connection pools (package dot, whose doc.go has the pool's own map and words).
// Every design number and heuristic, and why it is what it is, is in
// docs/design.md; the code names each once, as a constant.
//
// # Files
//
// One query's way, from the top: plugin.go admits it, route.go takes it through
// the upstreams, upstream.go hands it to one upstream's pool and learns from the
// result; nothing lower calls back up.
//
//   - plugin.go: the handler (ServeDNS: match, refuse, admit) and its lifecycle
//     (OnStartup, OnShutdown).
//   - route.go: a query's whole way through the upstreams: the candidates in
//     policy order, each exchange's outcome settled (failover, retry, give up),
//     the hedge race and the metadata naming the upstream that answered.
//   - hedge.go: hedge delays (fixed, or auto from the answer-time model) and the
//     hedge budget.
//   - upstream.go: one upstream: its pool, its health, its answer times, and the
//     exchange that feeds them.
//   - answertime.go: the answer-time model of an upstream, read by the latency
//     policy and hedge auto.
//   - health.go: whether an upstream is up; prober.go: its health probes.
//   - policy.go: the orders in which upstreams are tried.
//   - setup.go, options.go, targets.go: the Corefile; ready.go: the ready plugin.
//   - metrics.go: Prometheus metrics, and the pool's events turned into them.
//   - nofiles.go: a process out of file descriptors: logged once, with the fix.
//   - errors.go: sentinel errors.
//
// # Words
//
// Each word means one thing here and in package dot.
//
//   - exchange: one query sent to one upstream (upstream.exchange) and its answer
//     or error; an attempt, counted against max_connect_attempts.
//   - route: one query's way through the upstreams: the candidates left, the
//     attempts made, the held failover answer, the last error.
//   - candidates: the upstreams a query may try, in policy order, without the
//     down ones (all down: the one whose last failure is oldest).
//   - outcome: one exchange's upstream and its answer or error.
//   - win: an outcome that ends the query: an answer whose rcode is not listed
//     in failover.
//   - settle: take an outcome into the route: answer the client, hold a failover
//     answer, retry the upstream on the next pass, or drop it from the list.
//   - unsent: an error that proves the query was never written upstream; only
//     then may a non-QUERY message go to another upstream.
//   - hedge: a second exchange of the same query with the next candidate, sent
//     when the first has not answered within the hedge delay.
//   - race: a query's first exchange and its hedge; the first win answers and
//     the other exchange is cancelled. (The pool's second attempt of a query
//     stuck on a blocked connection is a rescue, not a race.)
//   - hedge budget: the share of queries (MAX_PERCENT, plus a burst) that may be
//     hedged.
//   - answer time: how long an upstream took to answer one exchange, as the
//     client waits for it (answertime.go). Its mean ranks upstreams for the
//     latency policy; its quantile over a window sets hedge auto's delay.
//   - miss: an exchange that ended without an answer while time was left; it
//     weighs as a read timeout in the mean answer time. Not a failure.
//   - failure: a fault of the upstream itself: a failed health probe, or the
//     pool's dot.Observer.Failed (a failed dial or handshake, a connection that
//     died before its first answer, a stall). max_fails consecutive failures
//     mark it down; one answer marks it up.
//   - down: an upstream queries skip (health.go).
//   - suspect: an upstream with a failure since its last answer; only suspect
//     and down upstreams are probed.
//   - probe: a health probe (prober.go): a query for health_check's domain sent
//     through the upstream's pool.
//   - admission: a query's place under max_concurrent (admit, leave).
//   - pending: an exchange begun and not yet returned; the latency policy scales
//     an upstream's mean answer time by them (the inflight gauge shows them).
package dotforward
