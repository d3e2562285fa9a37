package engine

import (
	"math"
	"math/bits"
	"sync"
	"time"

	"github.com/epochsketch/epochsketch/rate"
)

// budgetEstimate is a wallet's spend for key and the threshold that
// applies, for a request that would add add (0: a wait or a report), and
// whether the fleet asks to be told once it is charged.
func (e *Engine) budgetEstimate(s *Set, ru *Rule, key string, newKey bool, add uint32, now time.Time, sc *Scratch) (est, theta uint32, tell bool) {
	b := ru.Budget
	sc.buf = skey2(sc.buf, ru.Name, b.Spec.Name, key)
	a := e.shared(Query{Key: sc.buf, Local: b.sk, Tick: b.Lim.Tick, Theta: b.Lim.Threshold,
		Count: b.sk.EstimateBytes(sc.buf), Add: add, Wallet: true, Now: now})
	est, tell = a.Est, a.Tell
	theta = b.Lim.Threshold
	if newKey {
		theta = max(b.Reserve, uint32(float64(theta)*s.nk.BudgetFactor))
	}
	return est, theta, tell
}

// checkBudget decides v's wallet without charging it: OverBudget if the
// cost does not fit, BudgetUnknown if the fleet cannot say and the wallet
// fails closed. ok reports that it fits.
func (e *Engine) checkBudget(s *Set, v *Verdict, now time.Time, sc *Scratch) (refusal Verdict, ok bool) {
	ru, key := v.Rule, v.Key
	b := ru.Budget
	if f := e.opts.Fleet; f != nil {
		if closed, wait := f.WalletsClosed(); closed {
			return Verdict{Out: BudgetUnknown, Rule: ru, Key: key, Retry: wait}, false
		}
	}
	// What the fleet shares of a wallet is what requests charge: the cost,
	// at least a unit's counts.
	est, theta, tell := e.budgetEstimate(s, ru, key, v.newKey, max(b.Cost, rate.Unit), now, sc)
	v.tellBudget = tell
	held := uint64(max(0, b.Held.Get(ru.Name, key)))
	if uint64(est)+held+uint64(b.Reserve) > uint64(theta) {
		return Verdict{Out: OverBudget, Rule: ru, Key: key, Est: est, Theta: theta, Over: true,
			Level: float64(est) / float64(theta)}, false
	}
	return Verdict{}, true
}

// chargeAll charges the wallets of verdicts ix of an admitted request
// their cost and holds their reservations, into d.Wallets. A wallet whose
// key the sketch cannot take (its bucket is full of bigger spenders) and
// that does not fail open refuses the request with BudgetUnknown: the
// costs charged stay charged, the reservations go. admit calls it only
// with wallets to charge (ix not empty).
func (e *Engine) chargeAll(d *Decision, ix []int, sc *Scratch) {
	d.Wallets = make([]*Wallet, 0, len(ix))
	for _, i := range ix {
		v := &d.Verdicts[i]
		if !e.charge(v.Rule, v.Key, v.tellBudget, sc) {
			// An admission miss: the lottery may admit the key on a retry,
			// so it retries soon.
			for _, w := range d.Wallets {
				w.Release()
			}
			d.Wallets = nil
			d.Worst, d.worst, d.Admitted = Verdict{Out: BudgetUnknown, Rule: v.Rule, Key: v.Key, Retry: time.Second}, i, false
			return
		}
		d.Wallets = append(d.Wallets, &Wallet{e: e, rule: v.Rule, key: v.Key})
	}
}

// charge charges key's wallet in ru its cost and holds its reservation,
// telling the fleet if it asked (tell). It reports false when the sketch
// did not take the key and the wallet does not fail open: the spend is not
// tracked, so nothing was held.
func (e *Engine) charge(ru *Rule, key string, tell bool, sc *Scratch) bool {
	b := ru.Budget
	sc.buf = skey2(sc.buf, ru.Name, b.Spec.Name, key)
	b.sk.ObserveBytesN(time.Time{}, sc.buf, b.Cost)
	if tell {
		e.opts.Fleet.Counted(sc.buf)
	}
	if b.sk.EstimateBytes(sc.buf) == 0 && !b.Spec.FailOpen {
		return false
	}
	b.Held.Add(ru.Name, key, int64(b.Reserve))
	return true
}

// Wallet is one admitted request's account with one wallet: its cost was
// charged and its reservation held when it was admitted; Settle charges
// what the upstream reports it used, and the reservation is given back
// once, by Release or by the Decision's Done. Safe for concurrent use.
type Wallet struct {
	e    *Engine
	rule *Rule
	key  string

	mu                      sync.Mutex
	settled, released, kept bool
}

// Rule is the wallet's rule.
func (w *Wallet) Rule() *Rule { return w.rule }

// Key is the key the wallet is charged to.
func (w *Wallet) Key() string { return w.key }

// Spec is the wallet's configuration.
func (w *Wallet) Spec() *BudgetSpec { return &w.rule.Budget.Spec }

// Settled reports whether Settle has charged a report already.
func (w *Wallet) Settled() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.settled
}

// Settle charges, once, what the upstream reported the request used,
// beyond its cost: used units in all. It returns the units charged (0
// when used fits in the cost, or the sketch counts no more), and false if
// the wallet was settled already (then it charges nothing).
func (w *Wallet) Settle(used uint64) (charged uint64, first bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.settled {
		return 0, false
	}
	w.settled = true
	return w.e.settle(w.rule, w.key, used), true
}

// MarkSettled records that the request's report was read and found
// unusable: only the cost stays charged, and no later report is charged.
// It returns false if the wallet was settled already.
func (w *Wallet) MarkSettled() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	first := !w.settled
	w.settled = true
	return first
}

// Keep says the door gives the reservation back itself, later than the
// request's Done (it still reads the upstream's response for a report).
func (w *Wallet) Keep() {
	w.mu.Lock()
	w.kept = true
	w.mu.Unlock()
}

// Release gives the reservation back, once.
func (w *Wallet) Release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.release()
}

func (w *Wallet) releaseUnlessKept() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.kept {
		w.release()
	}
}

func (w *Wallet) release() {
	if !w.released {
		w.released = true
		b := w.rule.Budget
		b.Held.Add(w.rule.Name, w.key, -int64(b.Reserve))
	}
}

// settle charges key's wallet in ru what an upstream reported beyond the
// cost: used units in all. It returns the units charged.
func (e *Engine) settle(ru *Rule, key string, used uint64) uint64 {
	b := ru.Budget
	usedC := uint64(countsOf(used, b.Spec.Unit))
	if usedC <= uint64(b.Cost) {
		return 0
	}
	extra := uint32(min(usedC-uint64(b.Cost), math.MaxUint32))
	buf := skey2(nil, ru.Name, b.Spec.Name, key)
	before := b.sk.EstimateBytes(buf)
	after, _ := b.sk.ObserveBytesN(time.Time{}, buf, extra)
	if after > before {
		return uint64(after-before) / rate.Unit * b.Spec.Unit
	}
	return 0
}

// WalletLocks makes a wallet's check and its charge one step for each
// (rule, key): 64 mutexes, a wallet's chosen by its shard of the budget's
// held counts (the seeded hash of its rule and key). A request locks the
// stripes of all its wallets at once, in ascending order, so two requests
// with wallets in common cannot deadlock.
type WalletLocks [64]sync.Mutex

// Lock locks the stripes of the wallets among vs and returns them as a
// mask, for Unlock.
func (l *WalletLocks) Lock(vs []Verdict) uint64 {
	var mask uint64
	for i := range vs {
		if v := &vs[i]; v.Rule != nil && v.Rule.Budget != nil && v.Out != Allowlisted {
			mask |= 1 << v.Rule.Budget.Held.Shard(v.Rule.Name, v.Key)
		}
	}
	for m := mask; m != 0; m &= m - 1 {
		l[bits.TrailingZeros64(m)].Lock()
	}
	return mask
}

// Unlock unlocks the stripes Lock locked.
func (l *WalletLocks) Unlock(mask uint64) {
	for m := mask; m != 0; m &= m - 1 {
		l[bits.TrailingZeros64(m)].Unlock()
	}
}

// Spent is what key has spent of ru's wallet, in units (this replica's
// count).
func (e *Engine) Spent(ru *Rule, key string) uint64 {
	b := ru.Budget
	return uint64(b.sk.EstimateBytes(skey2(nil, ru.Name, b.Spec.Name, key))) / rate.Unit * b.Spec.Unit
}
