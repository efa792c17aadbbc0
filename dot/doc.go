// Package dot exchanges DNS messages with one DNS-over-TLS upstream (RFC 7858) over a
// small pool of long-lived, pipelined TLS connections.
//
// Each connection carries up to MaxInflight queries at once; answers may come back
// in any order and are matched by a connection-local message ID and the question.
// A query whose connection dies before it was written moves to another connection;
// one that was written is replayed once (RFC 7766 §6.2.4). The package knows nothing
// of CoreDNS: it takes and returns *dns.Msg.
//
// # Files
//
//   - pool.go: the Pool: picking a connection for a call, waiting, dialing, closing.
//   - exchange.go: one query's way through the pool: attempts, moves and the replay.
//   - call.go: a call, one attempt of a query on one connection, and its states.
//   - conn.go: a connection: its call table, IDs, states (open, draining, closed).
//   - writer.go, reader.go: a connection's two goroutines.
//   - records.go: how a batch of queries is framed into TLS records, and the trial.
//   - batchconn.go: the socket under TLS: one write per batch, quick ACKs.
//   - sweep.go: the pool's ticker: timeouts, tombstones, stall, drain and idle.
//   - learned.go: what the pool learns of its upstream (query limit, record verdict).
//   - query.go: a client's query prepared once for the upstream, and what is refused.
//   - answer.go: matching an upstream's answer to its query, and unpacking it for the client.
//   - wire.go: walking names and records on the wire, for both.
//   - coalesce.go: identical queries in flight share one exchange (flights).
//   - backoff.go, tls.go, config.go, observer.go, errors.go.
//
// # Words
//
//   - query: a client's message, prepared once for every attempt (type query).
//   - call: one attempt of a query on one connection; it holds a slot and an ID.
//   - slot: room for one outstanding call on a connection, MaxInflight per connection.
//   - tombstone: the call of a query whose caller gave up after it was written: its
//     slot and ID stay taken until the late answer arrives or TombstoneTTL passes,
//     so that the late answer cannot reach a newer query.
//   - move: a call that was never written goes to another connection at no cost.
//   - replay: a written call whose connection died is sent once more elsewhere.
//   - drain: a connection takes no new calls and closes once its last answer is in.
//   - stall: a connection that reads nothing while queries wait (see sweep.go).
//   - query limit: the calls a server serves on one connection before it cuts it,
//     learned from its cuts; connections drain before reaching it.
//   - record verdict: whether the upstream reads every query of a TLS record
//     (shared records) or only the first (a record each), found by a trial.
//   - strike: a failed dial or connection, counted by the reconnect backoff.
//   - failure: what the Observer's Failed reports: a fault of the upstream itself
//     (used for health), as opposed to one slow or lost query.
//   - coalesce: a query identical to one in flight (the same upstream wire but for
//     the ID and the question name's case) waits for that one's answer instead of
//     going upstream itself; it gets a message of its own built from that answer.
//   - flight: one query's exchange (its leader's) that identical queries join as
//     waiters, from the leader's start until its answer is delivered or it fails.
//
// # Locks
//
// Pool.mu and conn.mu are never held together: code holding one releases it
// before calling into code that takes the other (closeFor calls Pool.connClosed
// after releasing conn.mu; the pool reads connections through atomics, not under
// their locks). batchConn.mu is a leaf: nothing is called with it held. So is a
// flight shard's lock (flightShard.mu, guarding its map of open flights and their
// waiters): it is taken with neither Pool.mu nor conn.mu held (the reader ends a
// flight in deliver, after dispatch released conn.mu), and the waiters are sent
// their results after it is released. Fields read on the hot path without a lock
// are atomics, written under the lock named in their comment.
package dot
