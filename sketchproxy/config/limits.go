package config

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/epochsketch/epochsketch/rate"
)

// Limit is "Requests per Per, with bursts of Burst": how it maps onto a
// decayed count is docs/rules-and-limits.md's "How a limit maps onto a decayed count".
type Limit struct {
	// Name names the limit in RateLimit-Policy, metrics and logs, unique
	// in its rule. An unnamed limit is named by its period as written:
	// per-10s, per-1m, per-1h30m, per-1d, per-1_5s; a second one over the
	// same period is per-10s-2.
	Name string `yaml:"name" example:"per-minute"`
	// Requests is how many requests a key may send per Per (1 or more).
	Requests float64 `yaml:"requests" example:"100"`
	// Per is the limit's period, 1ms to 366d (required).
	Per Duration `yaml:"per" example:"1m"`
	// Burst is the most requests a quiet key may send at once: by default
	// Requests, rounded; 1 to 133,152 (package rate, which compiles
	// every door's limits and package limit's alike).
	Burst float64 `yaml:"burst" example:"20"`
}

// prepareLimits names the rule's unnamed limits by their period and
// compiles each, so that a limit the engine cannot hold is an error here.
func (r *Rule) prepareLimits(at ruleAt) error {
	lnames := map[string]bool{}
	for j := range r.Limits {
		l := &r.Limits[j]
		if l.Name == "" {
			l.Name = defaultLimitName(time.Duration(l.Per), lnames)
		}
		if !validName(l.Name) || lnames[l.Name] {
			return at(fmt.Sprintf("%q: names must be unique in the rule, letters, digits, - and _", l.Name), "limits", j, "name")
		}
		lnames[l.Name] = true
		if err := checkRate(l.Requests, time.Duration(l.Per)); err != nil {
			return at(err.Error(), "limits", j)
		}
		rl, err := compileRate(l.rate(), func(msg string, field string) error { return at(msg, "limits", j, field) })
		if err != nil {
			return err
		}
		l.Burst = float64(rl.Burst) // the default applied, as compiled
	}
	return nil
}

// LimitName names a limit by its period, as it is written: per-10s,
// per-1m, per-1h30m, per-1d, per-1_5s: the name of a rule's limit that has
// none of its own, and of a Caddy zone's.
func LimitName(per time.Duration) string {
	var s string
	if per >= 24*time.Hour && per%(24*time.Hour) == 0 {
		s = fmt.Sprintf("%dd", per/(24*time.Hour))
	} else {
		s = per.String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
	}
	return "per-" + strings.ReplaceAll(s, ".", "_")
}

// defaultLimitName is LimitName; a second limit over the same period in
// the rule gets -2, and so on.
func defaultLimitName(per time.Duration, taken map[string]bool) string {
	base := LimitName(per)
	name := base
	for n := 2; taken[name]; n++ {
		name = fmt.Sprintf("%s-%d", base, n)
	}
	return name
}

// rate is the limit as package rate compiles it, as every door's limits
// are.
func (l *Limit) rate() rate.Rate {
	return rate.Rate{Requests: l.Requests, Per: time.Duration(l.Per), Burst: l.Burst}
}

// compileRate compiles r, or says what is wrong through at, with the YAML
// name of the field at fault (requests, per or burst).
func compileRate(r rate.Rate, at func(msg, field string) error) (rate.Limit, error) {
	l, err := r.Compile()
	var re *rate.Error
	if errors.As(err, &re) {
		return l, at(re.Msg, strings.ToLower(re.Field))
	}
	return l, nil
}

// checkRate checks n per per, a limit's or a budget's, before it is
// compiled: a period from 1ms to 366d, and at least one request.
func checkRate(n float64, per time.Duration) error {
	if per == 0 {
		return fmt.Errorf("per is missing or 0: say e.g. per: 1m")
	}
	if per < time.Millisecond || per > 366*24*time.Hour {
		return fmt.Errorf("per %v: want 1ms to 366d", per)
	}
	if !(n >= 1) || n > 1e12 {
		return fmt.Errorf("requests %g: want 1 or more", n)
	}
	return nil
}
