package dot

import (
	"fmt"
	"runtime"
	"time"
)

// writeLoop writes queued calls: everything queued while it was busy goes out in
// one flush, one syscall for a burst of queries (see records.go for how they are
// framed into TLS records).
func (c *conn) writeLoop() {
	defer c.pool.wg.Done()
	defer c.loopDone()
	batch := c.bufs.batch[:0]
	defer func() { c.bufs.batch = batch[:0] }()
	for {
		var ok bool
		if batch, ok = c.gather(batch[:0]); !ok {
			return
		}
		err := c.writeBatch(batch)
		clear(batch)
		if err != nil {
			c.writeFailed(err)
			return
		}
	}
}

// gather waits for a queued call and takes everything queued behind it. It yields
// once, so that callers about to queue make it into this write (gRPC's loopy writer
// does the same). It returns false when the connection is closed.
func (c *conn) gather(batch []*call) ([]*call, bool) {
	select {
	case cl := <-c.writeq:
		batch = append(batch, cl)
	case <-c.done:
		return batch, false
	}
	yielded, size := false, len(batch[0].q.wire)
	for {
		select {
		case cl := <-c.writeq:
			batch = append(batch, cl)
			size += len(cl.q.wire)
			continue
		default:
		}
		if yielded || size >= batchBytes {
			return batch, true
		}
		yielded = true
		runtime.Gosched()
	}
}

// writeBatch writes the calls of batch that are still queued, in shared TLS records
// if the upstream is known to read them, else one record each; a batch of three or
// more runs the record trial when there is no verdict yet.
func (c *conn) writeBatch(batch []*call) error {
	v := c.pool.verdict()
	if v == verdictNone && len(batch) >= 3 && c.pool.startTrial() {
		if err := c.trial(batch); err != nil {
			return err
		}
		batch, v = batch[2:], c.pool.verdict()
	}
	f := ownRecords
	if v == verdictShared {
		f = sharedRecords
	}
	_, err := c.writeRecords(batch, f)
	return err
}

// writeFailed handles the writer's first (sticky) error. A write usually fails
// because the server closed the connection, and answers it sent before closing may
// still be unread: the reader gets a short grace to deliver them and to see the
// server's EOF before the connection is closed as failed.
func (c *conn) writeFailed(err error) {
	c.mu.Lock()
	c.werr = fmt.Errorf("write: %w", err)
	c.unusable.Store(true)
	c.mu.Unlock()
	c.tc.SetReadDeadline(time.Now().Add(closeGrace))
}

// batchBytes: below this much buffered, the writer yields once before flushing.
const batchBytes = 4 << 10
