package config

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/epochsketch/epochsketch/rate"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// Budget is a per-key wallet: Units per Per, charged Cost per admitted
// request and then what the upstream reports in ReconcileHeader (the units
// the request really used, e.g. tokens), as a response header or trailer.
// While a request runs, Reserve units are held against the wallet: a
// request is admitted only if what is spent, what is held and its own
// reservation fit in Units. See docs/rules-and-limits.md, "What a budget means".
type Budget struct {
	// Name names the wallet in RateLimit-Policy, metrics and logs.
	Name string `yaml:"name" example:"tokens"`
	// Units is how many units a key may spend per Per (required).
	Units float64 `yaml:"units" example:"100000"`
	// Per is the wallet's period, 1ms to 366d (required).
	Per Duration `yaml:"per" example:"1d"`
	// Cost is charged when a request is admitted: a minimum charge. A
	// reported usage above it is charged on top.
	Cost uint64 `yaml:"cost" example:"500"`
	// ReconcileHeader is the response header (or trailer) in which the
	// upstream reports the units a request used; without it every request
	// costs Cost.
	ReconcileHeader string `yaml:"reconcile_header" example:"X-Tokens-Used"`
	// Reserve is held for each request in flight until its usage is known
	// (by default Cost; never less). Set it near a typical request's
	// usage: N requests in flight can overspend by at most N x (their
	// usage - Reserve).
	Reserve uint64 `yaml:"reserve" example:"2000"`
	// Unit is how many units one count stands for, up to 2^40. A wallet
	// holds at most 8,388,607 counts per period, so 10M tokens a day need
	// unit: 10 or more; charges round up to whole counts.
	Unit uint64 `yaml:"unit" example:"10"`
	// ReconcileWait is how long an upstream response is still read after
	// its client has gone, to charge usage it reports at its end (a
	// trailer), when the proxy's transport is the Middleware's Transport,
	// up to 1h (0, or a negative value in code: not read after the client
	// has gone).
	ReconcileWait Duration `yaml:"reconcile_wait" example:"1m"`
	// FailOpen lets a request through when its key's spend cannot be
	// tracked (the sketch could not hold the key). Off, the request fails
	// closed with 503, because an untracked wallet is an unbounded one.
	FailOpen bool `yaml:"fail_open" example:"true"`
}

// prepare applies the budget of rules[i] its defaults and checks it.
func (b *Budget) prepare(c *Config, at ruleAt, i int) error {
	if b.Name == "" {
		b.Name = "budget"
	}
	orDefault(&b.Cost, 1)
	orDefault(&b.Reserve, b.Cost)
	orDefault(&b.Unit, 1)
	if err := orNone(c, &b.ReconcileWait, Duration(time.Minute), "rules", i, "budget", "reconcile_wait"); err != nil {
		return err
	}
	if err := checkRate(b.Units, time.Duration(b.Per)); err != nil {
		return at(strings.Replace(err.Error(), "requests", "units", 1), "budget")
	}
	if err := b.checkCounts(at); err != nil {
		return err
	}
	return b.checkCharges(at)
}

// checkCounts checks that the wallet fits a sketch's counts: at most
// rate.MaxBurstHalving counts of Unit units per period, and at least one.
func (b *Budget) checkCounts(at ruleAt) error {
	if b.Unit > 1<<40 {
		return at(fmt.Sprintf("unit %d: at most 2^40", b.Unit), "budget", "unit")
	}
	if counts := b.Units / float64(b.Unit); counts > rate.MaxBurstHalving {
		return at(fmt.Sprintf("units %g: at most %d counts per period (a slot's count is 24 bits, two per unit); set unit: %d or more",
			b.Units, rate.MaxBurstHalving, uint64(math.Ceil(b.Units/rate.MaxBurstHalving))), "budget", "units")
	} else if counts < 1 {
		return at(fmt.Sprintf("units %g is less than one unit of %d", b.Units, b.Unit), "budget", "unit")
	}
	return nil
}

// checkCharges checks what one request is charged and holds against the
// whole budget, and the wait for its usage.
func (b *Budget) checkCharges(at ruleAt) error {
	if float64(b.Cost) > b.Units {
		return at(fmt.Sprintf("cost %d is more than the whole budget %g", b.Cost, b.Units), "budget", "cost")
	}
	if float64(b.Reserve) > b.Units {
		return at(fmt.Sprintf("reserve %d is more than the whole budget %g", b.Reserve, b.Units), "budget", "reserve")
	}
	if b.Reserve < b.Cost {
		return at(fmt.Sprintf("reserve %d is less than cost %d: a request holds at least what it is charged", b.Reserve, b.Cost), "budget", "reserve")
	}
	if b.ReconcileWait < 0 || b.ReconcileWait > Duration(time.Hour) {
		return at("want 0 to 1h", "budget", "reconcile_wait")
	}
	return nil
}

// spec is the prepared wallet as the engine compiles it.
func (b *Budget) spec() *engine.BudgetSpec {
	return &engine.BudgetSpec{Name: b.Name, Units: b.Units, Per: time.Duration(b.Per), Unit: b.Unit, Cost: b.Cost, Reserve: b.Reserve, FailOpen: b.FailOpen,
		ReconcileHeader: b.ReconcileHeader, ReconcileWait: time.Duration(b.ReconcileWait)}
}
