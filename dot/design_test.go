package dot

import (
	"testing"

	"github.com/dotforward/dotforward/dot/dottest"
)

// TestDesignNumbers checks docs/design.md's tables of the pool's numbers
// against the constants themselves: the document is their one home outside
// the code, and must not drift from it.
func TestDesignNumbers(t *testing.T) {
	dottest.CheckDesign(t, "../docs/design.md", "The pool", map[string]any{
		"AutoMaxConnsOutOfOrder":   AutoMaxConnsOutOfOrder,
		"AutoMaxConnsInOrder":      AutoMaxConnsInOrder,
		"orderCheckEvery":          orderCheckEvery,
		"minJudgeLate":             minJudgeLate,
		"judgeFactor":              judgeFactor,
		"serialGap":                serialGap,
		"minRescueEvidence":        minRescueEvidence,
		"minSlowEvidence":          minSlowEvidence,
		"slowShare":                slowShare,
		"minSideEvidence":          minSideEvidence,
		"sideShare":                sideShare,
		"sideWait":                 sideWait,
		"waitedFactor":             waitedFactor,
		"minServiceGap":            minServiceGap,
		"minWaitedEvidence":        minWaitedEvidence,
		"waitedShare":              waitedShare,
		"untimedMaxConns":          untimedMaxConns,
		"shareWindow":              shareWindow,
		"firstDialShare":           firstDialShare,
		"slowWeightUnit":           slowWeightUnit,
		"minCrowdedEvidence":       minCrowdedEvidence,
		"crowdedFactor":            crowdedFactor,
		"crowdedMargin":            crowdedMargin,
		"gainFactor":               gainFactor,
		"inOrderHeadroom":          inOrderHeadroom,
		"inOrderSpares":            inOrderSpares,
		"inOrderIdle":              inOrderIdle,
		"learnedTTL":               learnedTTL,
		"minLearnedLimit":          minLearnedLimit,
		"maxReplays":               maxReplays,
		"restartWindow":            restartWindow,
		"silentAfter":              silentAfter,
		"minSilentQuiet":           minSilentQuiet,
		"minSilentBeyond":          minSilentBeyond,
		"minRescueDelay":           minRescueDelay,
		"rescueFactor":             rescueFactor,
		"unknownSlow":              unknownSlow,
		"rescueShare":              rescueShare,
		"maxRescueBurst":           maxRescueBurst,
		"maxParallelDials":         maxParallelDials,
		"minExtraConns":            minExtraConns,
		"nearEndLead":              nearEndLead,
		"idleRaceAfter":            idleRaceAfter,
		"minIdleLife":              minIdleLife,
		"maxWaitersPerSlot":        maxWaitersPerSlot,
		"DefaultBackoffBase":       DefaultBackoffBase,
		"DefaultBackoffMultiplier": DefaultBackoffMultiplier,
		"DefaultBackoffJitter":     DefaultBackoffJitter,
		"DefaultBackoffMax":        DefaultBackoffMax,
		"trialTimeout":             trialTimeout,
		"minTrialGrace":            minTrialGrace,
		"ownTTL":                   ownTTL,
		"flightShards":             flightShards,
		"maxJoiners":               maxJoiners,
		"DefaultMaxInflight":       DefaultMaxInflight,
		"DefaultDialTimeout":       DefaultDialTimeout,
		"DefaultReadTimeout":       DefaultReadTimeout,
		"DefaultWriteTimeout":      DefaultWriteTimeout,
		"DefaultStallTimeout":      DefaultStallTimeout,
		"DefaultIdleTimeout":       DefaultIdleTimeout,
		"DefaultTombstoneTTL":      DefaultTombstoneTTL,
		"DefaultPadBlock":          DefaultPadBlock,
		"MaxMaxConns":              MaxMaxConns,
		"MaxMaxInflight":           MaxMaxInflight,
	})
}
