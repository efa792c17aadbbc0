package dotforward

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/dotforward/dotforward/dot"
)

// answerTime is the plugin's one model of how fast an upstream answers, as a
// client of this plugin sees it: from handing a query to the pool until its
// answer or error, pool waits, moves, replays and rescues included. Every
// exchange's result enters it here, once, and it keeps two statistics of the
// same samples for their two readers (docs/design.md, "Answer times", says why
// two, and why the pool's usual answer time, dot/learned.go, is a third
// quantity):
//   - mean, an EWMA over about the last eight answers, for the latency policy,
//     which must turn away from an upstream within a few slow answers;
//   - hedge, the hedge auto delay's window of hedgeWindow answers and its
//     quantile (hedge.go), which needs many samples and must not move with a
//     handful of slow ones. nil unless the line has hedge auto.
//
// Health reads none of it: an answer time says nothing of whether an upstream
// is up (health.go).
type answerTime struct {
	readTimeout time.Duration   // what a miss weighs in mean (see missed)
	mean        atomic.Int64    // ns; 0 until the first sample
	hedge       *hedgeEstimator // set before the upstream starts
}

// ewmaWeight is the weight of a new sample in mean: about the last eight
// answers count.
const ewmaWeight = 0.25

// exchanged takes the result of one exchange that took took and ended with err.
// timeLeft says the caller's deadline and cancellation had not cut it short:
// only then does an error say something about the upstream.
func (a *answerTime) exchanged(took time.Duration, err error, timeLeft bool) {
	switch {
	case err == nil:
		a.addMean(took)
		a.hedge.observe(took)
		return
	case timeLeft:
		a.missed(err, took)
	}
	if errors.Is(err, dot.ErrTimeout) {
		a.hedge.observe(took) // no answer after took: a lower bound of one
	}
}

// cutShort takes an exchange abandoned after took because its hedge answered
// first: a lower bound of its answer time, which keeps the hedge delay honest
// about the slow answers it no longer sees. mean does not take it: the
// upstream that won the race is the one the latency policy hears about.
func (a *answerTime) cutShort(took time.Duration) { a.hedge.observe(took) }

// missed takes an exchange that ended without an answer while time was left: it
// weighs as much as a read timeout in mean, so that the latency policy moves
// away from an upstream that fails fast. The caller's deadline or cancellation,
// a query the pool refused as bad and a process out of file descriptors
// (nofiles.go) say nothing about the upstream. A miss is
// not a failure (the glossary's word, which feeds health): the pool reports
// those itself, through dot.Observer.Failed.
func (a *answerTime) missed(err error, took time.Duration) {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, dot.ErrBadQuery) || isNoFiles(err) {
		return
	}
	a.addMean(max(took, a.readTimeout))
}

func (a *answerTime) addMean(took time.Duration) {
	for {
		old := a.mean.Load()
		next := int64(took)
		if old != 0 {
			next = old + int64(ewmaWeight*float64(int64(took)-old))
		}
		if a.mean.CompareAndSwap(old, next) {
			return
		}
	}
}
