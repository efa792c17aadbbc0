// Package dot exchanges DNS messages with one DNS-over-TLS upstream (RFC 7858) over a
// pool of long-lived, pipelined TLS connections that sizes itself to the upstream.
//
// Each connection carries up to MaxInflight queries at once; answers may come back
// in any order and are matched by a connection-local message ID and the question.
// A query whose connection dies before it was written moves to another connection;
// one that was written is replayed (RFC 7766 §6.2.4). The pool learns how the
// upstream serves a connection (its mode): out of order, a few full connections
// carry any load; in order, a query waits for every one before it, so each goes to
// an idle connection, or waits for one dialled for it, as forward does, and there
// are as many as the load needs (pick.go, sizing.go). Until it knows, a slow upstream is
// served that way too: on it, that costs no time. A query
// shown stuck behind a slow answer (not merely slow) is sent once more
// elsewhere (rescue.go). The package knows nothing of CoreDNS: it takes and
// returns *dns.Msg. Every number and heuristic named here, and why it is what
// it is, is in docs/design.md.
//
// # Files
//
//   - pool.go: the Pool: dialing, a connection's end, Stats, closing.
//   - waiting.go: the waiting room: a query no connection has room for
//     waits, bounded, for a slot, a dial or its deadline (dialForWaiter: one
//     dial per waiting query; seatWithin: it counts out as it takes one).
//   - waitorder.go: its order: one query a connection, an idle one goes to
//     the query that has waited longest.
//   - pick.go: the hot path: picking a connection for a call as the mode says
//     (filled in turn, or one query each: oneEach, bursts before the first
//     answer).
//   - slowunknown.go: while the mode is unknown and the upstream slow or not
//     yet timed, a connection for each query (slowUnknown), and before the
//     first answer the bound that keeps a black hole cheap (untimedRoom).
//   - queuedepth.go: while the mode is unknown, no connection queued deeper
//     than a dial is worth (queueDepth; where a queue costs about a dial or
//     more, the oldest connection alone holds one, and in a pause none:
//     dearQueue, pausedFor), nor behind an answer overdue by a dial's time
//     (overdueAfter), and the waiting
//     queries that keep their own dials until that can be figured
//     (awaitsItsDial).
//   - firstdial.go: before the first answer, which queries share the pool's
//     first dial (its burst) and which dial their own, how many go on the
//     first connection (firstDialShareMax), and the waiting queries owed a
//     dial.
//   - sizing.go: how many connections the load wants, when to dial (the cap,
//     parallel dials, successors).
//   - rescue.go: blocked connections, rescues and the first answer of a query's two attempts.
//   - exchange.go: one query's way through the pool: attempts, moves, the replay.
//   - call.go: a call, one attempt of a query on one connection, and its states.
//   - conn.go: a connection: its call table, IDs, life (open, draining, closed)
//     and its one state for a new query (avail: taking, quiet, near its end,
//     blocked, draining, closed).
//   - keepalive.go: the server's idle timeout (RFC 7828 keepalive), which every
//     connection's own follows.
//   - census.go: the connections counted by state and load, for dial, sizing,
//     the sweeper and Stats.
//   - writer.go, reader.go: a connection's two goroutines.
//   - records.go: how a batch of queries is framed into TLS records, and the trial.
//   - batchconn.go: the socket under TLS: one write per batch, the write deadline
//     (armed ahead, see armLocked), quick ACKs, the read ahead of TLS.
//   - sweep.go: the pool's timer: every tick (fast while queries are out) the
//     watch for blocked and silent connections and the sizing; every
//     sweepInterval timeouts, tombstones, stall, drain, idle, and learning.
//   - holdup.go: a hold-up of the pool's process, measured by a late tick
//     (lateTick): how it dates the reads (servedBy) and a query's time in
//     service (noteHoldUp, overdue).
//   - learned.go: what the pool learns of its upstream (record verdict, mode and
//     usual answer time), and how the mode is decided from the evidence.
//   - answerlog.go: the answer log the mode is learned from: what one
//     connection's answers say (slow gaps, side by side, waited), collected by
//     the sweeper.
//   - querylimit.go: the query limit learned from a server's cuts (and from
//     silent connections, see silence.go), restarts told apart from it, the
//     depth no connection goes past before answers prove it (reach), and a
//     connection's side of it (draining at it, evicting past it).
//   - depthcost.go: out of order, what a query's place on its connection
//     costs it (answer time against depth, fitted), and the depth that
//     bounds a connection where it costs (a server working on k at once).
//   - orderedqueue.go: out of order, a connection whose queries past a
//     few wait in write order (its own answers show it), bounded, and the
//     queries already queued there rescued.
//   - serial.go: a connection's own order verdict (serial), weighed per
//     answer: out of order, one whose answers show it served in order takes
//     a query only with nothing outstanding (a balancer's in-order backend).
//   - silence.go: a silent connection, found on the sweeper's ticks, and what
//     its silence teaches the query limit.
//   - probe.go: the depth probe: a slow out-of-order upstream with no limit
//     known is filled no deeper than the write order it served, and one
//     connection at a time goes past it.
//   - query.go: a client's query prepared once for the upstream, and what is refused.
//   - answer.go: matching an upstream's answer to its query, and unpacking it for the client.
//   - wire.go: walking names and records on the wire, for both.
//   - coalesce.go: identical queries share one exchange (flights).
//   - fdlimit.go: a process out of file descriptors: no strike, a cap re-tested.
//   - backoff.go, tls.go, config.go, observer.go, errors.go.
//   - property_*_test.go: the property tests, the pool judged against a model
//     of forward (property_forward_test.go) on seeded upstreams served in
//     synctest bubbles (property_upstream_test.go): TestProperty's broad
//     draw (property_draw_test.go), TestPropertySteady's steady loads of
//     issue 21's upstreams, and TestPropertyMixed's (property_mixed_test.go)
//     balancers mixing backends, servers switched mid-run and bounded
//     pipelining; each with its known failures in testdata/.
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
//   - replay: a written call whose connection died (after answering others) is
//     sent once more elsewhere; again, up to maxReplays, if the server cut it
//     (while the pool learns its query limit, see queryLimit).
//   - drain: a connection takes no new calls and closes once its last answer is in.
//   - stall: a connection that reads nothing while queries wait (see sweep.go).
//   - query limit: the calls a server serves on one connection before it cuts it,
//     learned from its cuts (one at 16 answers or more, else two like ones in a
//     row) or from two connections silent after as many answers; connections
//     drain before reaching it, and the calls one holds beyond it when it is
//     learned are replayed at once (evicted).
//   - silent: a connection to an out-of-order upstream that answers nothing
//     written after its Nth call while later calls are answered elsewhere: the
//     server ignores the calls past its limit until its slowest answer
//     (silence.go). It drains, and its calls past the Nth are replayed at once.
//   - record verdict: whether the upstream reads every query of a TLS record
//     (shared records) or only the first (a record each), found by a trial.
//   - mode: how the upstream serves the queries of one connection: out of order
//     (an answer overtook a query written before it), in order (rescues won by
//     far, answers queued behind each other coming apart, or queries that
//     waited behind a slow answer coming one service time after it: see
//     docs/design.md for the thresholds), or unknown. Each is held by decayed
//     counts that answers keep renewing, and left only on evidence as strong as
//     what made it: in order is left when queries alone on their connection
//     stay four times slower for sweeps on end (crowded: more connections made
//     the upstream busier), and entered again only while in order would halve
//     the mean answer time it measured; nothing is barred for a time (see
//     serveMode.update).
//   - usual answer time: of a query written on a connection with nothing
//     outstanding, averaged (mode.usual); it scales the rescue delay. The
//     plugin's answer time, what a client waits, is another quantity
//     (docs/design.md, "Answer times").
//   - serial: a connection whose own answers show it served in order
//     (serial.go; never one with an answer of its own out of order): out of
//     order, it takes a query only with nothing outstanding.
//   - blocked: a connection that has read nothing for the rescue delay while a
//     query has waited that long behind an older one, and something shows that
//     it waits behind it rather than being slow itself (the mode is in order,
//     answers came queued behind others lately, a query written after it was
//     answered, or it has waited four mean answer times); it takes no new query.
//   - quiet: a connection that has read nothing for the rescue delay while
//     queries wait behind an older one, not (yet) shown blocked: it takes new
//     queries only when no other connection has room. The time runs from its
//     last read, or, while the rescue delay is at its floor and the mode not
//     in order, from its first query after an idle spell if that is later
//     (conn.quietFor).
//   - one each: while the mode is unknown and the upstream slow or not yet
//     timed, each query goes to a connection with nothing outstanding or
//     waits for one dialled for it, as forward sends them (oneEach); a burst
//     before the first answer shares one.
//   - hold-up: a stretch in which the pool's own process did not run (a GC,
//     a descheduled thread: a busy machine's hiccup), measured by a sweeper
//     tick that ran past lateTick (noteHoldUp); the upstream's answers of it
//     wait unread, and no query counts as in service through it (overdue).
//   - rescue: a query stuck on a blocked connection is sent once more on another
//     (idle) connection; the first answer of the two attempts wins (firstOfTwo),
//     the other is given up and its late answer dropped (reason rescued). A
//     query that is merely slow is never rescued. (A race is the plugin's
//     hedge race.)
//   - order check: in order, one query in orderCheckEvery is put behind a
//     just-written one on purpose, so that an upstream that starts answering
//     out of order shows it (more often while the belief is young:
//     orderCheckRate); slow and unknown, only while the load holds
//     steady (orderCheckRolled). (A probe is the plugin's health probe.)
//   - near its end: a connection past half the query limit (one each: with
//     only a dial's time of answers left, see nearEndAfter) or
//     close to MaxAge; its successor is dialled then (make before break).
//   - taking: a connection that takes new queries: its state (conn.avail) is
//     taking, quiet or near its end, not blocked, draining or closed. One census
//     of these states (census.go) is what dial, sizing, the sweeper and Stats
//     count (Stats.Taking, SizeObserver.Sized's taking and the conns_taking
//     gauge are the same number).
//   - strike: a failed dial or connection, counted by the reconnect backoff.
//   - failure: what the Observer's Failed reports: a fault of the upstream itself
//     (used for health), as opposed to one slow or lost query.
//   - coalesce: a query identical to one whose flight is open (the same upstream wire but for
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
// flight shard's lock (flightShard.mu, guarding its table of open flights and
// their waiters): it is taken with neither Pool.mu nor conn.mu held (the reader
// ends a flight in deliver, after dispatch released conn.mu), and the waiters are
// sent their results after it is released. Fields read on the hot path without a
// lock are atomics, written under the lock named in their comment.
package dot
