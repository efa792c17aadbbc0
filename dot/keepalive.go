package dot

import "time"

// A server's idle timeout, as it tells it (RFC 7828 edns-tcp-keepalive): each
// connection's idle timeout follows the lowest one heard, so that the pool
// closes an unused connection before the server does, and never writes a
// query into one the server is closing.

// keepalive applies the server's RFC 7828 timeout (units of 100ms): close idle
// connections well before the server would, and drain on a timeout of 0.
func (c *conn) keepalive(units int) {
	if units == 0 {
		c.mu.Lock()
		c.setDrainingLocked(CloseDrain)
		c.mu.Unlock()
		return
	}
	told := time.Duration(units) * 100 * time.Millisecond
	c.lowerIdle(idleWithin(told))
	for old := c.pool.serverIdle.Load(); old == 0 || int64(told) < old; old = c.pool.serverIdle.Load() {
		if c.pool.serverIdle.CompareAndSwap(old, int64(told)) {
			// The server's timeout holds for the connections opened before
			// it was heard, too: a spare that carries no query hears it never,
			// and the server would close it first (e2e keepalive test: 3 idle
			// closes by the pool, 1 by unbound). c.mu is released: Pool.mu and
			// conn.mu are never held together, and the snapshot needs neither.
			for _, o := range *c.pool.conns.Load() {
				o.lowerIdle(idleWithin(told))
			}
			break
		}
	}
}

// lowerIdle lowers the connection's idle timeout to at most d.
func (c *conn) lowerIdle(d time.Duration) {
	c.mu.Lock()
	c.idle = min(c.idle, d)
	c.mu.Unlock()
}

// idleWithin is the idle timeout the pool keeps on a connection whose server
// told told (RFC 7828): a quarter under it, so that the pool closes first and
// never writes a query into a connection the server is closing.
func idleWithin(told time.Duration) time.Duration { return told * 3 / 4 }
