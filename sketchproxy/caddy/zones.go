package caddyepochsketch

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	spconfig "github.com/epochsketch/epochsketch/sketchproxy/config"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// Where a zone's counts live, and how long.
//
// Every zone is one rule of SketchProxy's engine, compiled into a Set of its
// own: its sketch, its counts. A handler decides every zone it holds in one
// engine call (a request one zone refuses is counted by none), so its zones
// must share an engine and the side sketches a decision reads beside the
// rules' (keys seen lately, new keys, bans): one Engine per process (and
// one per fleet setting, fleet.go), and one side Set per engine, sketch
// size and new-key setting, into which each zone's
// Set is compiled (engine.Compile shares the side sketches of the Set it
// is given as the previous one).
//
// Zones live in a caddy.UsagePool by what defines them: their place, name,
// key, limit, sketch size and new-key setting. A reload provisions the new
// config before the old one is cleaned up, so a zone the new config keeps
// is taken from the pool with its counts, whatever happened to the other
// zones; a zone that changed starts empty, and the old one is freed with
// the old config.
//
// A zone's place is where it is configured: at each level of routes down
// to the handler (the site's route, with its host matchers, then each
// handle, handle_path or route block), the matchers of the route that
// holds it, and whether that route is an error route (handle_errors).
// Identical zones in two sites or two handle blocks count apart; editing
// other lines, sites or zones moves nothing. The place leaves out what an
// edit elsewhere changes: the route's index among its level's routes
// (Caddy merges adjacent directives without matchers into one route, so a
// header line added above the directive shifts it) and the server's
// listen addresses (Caddy makes a server of each port, so one site block
// on two ports would count twice). Two zones whose places are equal all
// the way down (two sites that differ only in their port, two route
// blocks without matchers at one level, a snippet imported twice into one
// block) are told apart by their order among such zones in their server;
// across servers they are one count. A zone marked shared has no place:
// zones of the same name and definition anywhere share one count.
//
// Caddy tells a handler neither its site nor its route, so the place is
// read from what provisioning leaves visible (locate, below); where it
// cannot be read (a named route, a handler nested in another module's
// routes), the place stops there, and identical zones are told apart by
// their order in their server.

// engines holds the process's Engine (one, unless tests give handlers
// clocks of their own), the engines of the fleets now running (fleet.go),
// and what the fleets stopped since Caddy started had decided, for the
// metrics.
var engines struct {
	sync.Mutex
	m       map[engineKey]*engine.Engine
	fleets  map[*engine.Engine]bool
	retired map[decisionLabel]uint64
}

type engineKey struct {
	clock epochsketch.Clock
	seed  uint64
}

// engineFor returns the Engine for a clock and seed (nil and 0: the
// process's own).
func engineFor(clock epochsketch.Clock, seed uint64) *engine.Engine {
	engines.Lock()
	defer engines.Unlock()
	k := engineKey{clock, seed}
	if e := engines.m[k]; e != nil {
		return e
	}
	if engines.m == nil {
		engines.m = map[engineKey]*engine.Engine{}
	}
	e := engine.New(engine.Options{Clock: clock, Seed: seed})
	engines.m[k] = e
	return e
}

// addEngine counts a fleet's engine in the metrics while it runs.
func addEngine(e *engine.Engine) {
	engines.Lock()
	defer engines.Unlock()
	if engines.fleets == nil {
		engines.fleets = map[*engine.Engine]bool{}
	}
	engines.fleets[e] = true
}

// retireEngine keeps what a stopped fleet's engine decided in the metrics,
// which count from Caddy's start, and forgets the engine.
func retireEngine(e *engine.Engine) {
	engines.Lock()
	defer engines.Unlock()
	if engines.retired == nil {
		engines.retired = map[decisionLabel]uint64{}
	}
	eachDecision(e, func(l decisionLabel, n uint64) { engines.retired[l] += n })
	delete(engines.fleets, e)
}

// decisions calls f with the decisions of every engine of the process,
// those of stopped fleets included, by zone and outcome (a label may come
// more than once).
func decisions(f func(decisionLabel, uint64)) {
	engines.Lock()
	defer engines.Unlock()
	for l, n := range engines.retired {
		f(l, n)
	}
	for _, e := range engines.m {
		eachDecision(e, f)
	}
	for e := range engines.fleets {
		eachDecision(e, f)
	}
}

// spec is the engine's configuration for a handler's zones, less the rules:
// SketchProxy's defaults for the new-key defense and the tarpit (no zone is
// tarpitted, so no key is ever banned or held). Side Sets and zone Sets
// compiled from it share their side sketches.
func spec(buckets int, newKeysOff bool) *engine.Spec {
	return &engine.Spec{
		Buckets: buckets,
		Tarpit: engine.TarpitSpec{
			DelayAbove: 1, DripAbove: 1.5, RejectAbove: 2, BanAbove: 8,
			BanFor: 10 * time.Minute, MaxDelay: 5 * time.Second, MaxHeld: 256, MaxHeldPerKey: 2,
		},
		NewKeys: engine.NewKeysSpec{
			Disabled: newKeysOff, SpikeFactor: 4, MinPerSecond: 50, BudgetFactor: 0.25,
			Window: time.Minute, Remember: time.Hour, Warmup: time.Minute,
		},
	}
}

// The pools: side Sets, and zones.
var (
	sides = caddy.NewUsagePool()
	zones = caddy.NewUsagePool()
)

// sideState is a side Set in the pool.
type sideState struct {
	eng *engine.Engine
	set *engine.Set
}

// Destruct closes the side sketches once no zone and no handler uses them.
func (s *sideState) Destruct() error {
	s.eng.Retire(s.set, nil)
	return nil
}

// sideRef is a handler's (or a zone's) hold on a side Set.
type sideRef struct {
	key string
	*sideState
}

func (r *sideRef) release() { sides.Delete(r.key) }

// takeSide holds the side Set for eng, the handler's sketch size and its
// new-key setting.
func takeSide(eng *engine.Engine, engKey string, buckets int, newKeysOff bool) (*sideRef, error) {
	key := fmt.Sprintf("%s|%d|%t", engKey, buckets, newKeysOff)
	v, _, err := sides.LoadOrNew(key, func() (caddy.Destructor, error) {
		set, err := eng.Compile(spec(buckets, newKeysOff), nil)
		if err != nil {
			return nil, err
		}
		return &sideState{eng: eng, set: set}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("epochsketch: %v", err)
	}
	return &sideRef{key: key, sideState: v.(*sideState)}, nil
}

// zoneState is a zone in the pool: its Set (its own sketch, and the side
// sketches of the side Set it was compiled into) and its rule.
type zoneState struct {
	set  *engine.Set
	rule *engine.Rule
	side *sideRef // held while the zone lives
	logs engine.LogLimiter
}

// Destruct closes the zone's own sketch once no config uses the zone, and
// lets go of its side Set.
func (z *zoneState) Destruct() error {
	z.side.eng.Retire(z.set, z.side.set)
	z.side.release()
	return nil
}

// zoneRef is one of a handler's zones: its configuration, its key, and its
// hold on the zone in the pool.
type zoneRef struct {
	name    string
	zone    *Zone
	key     keyTemplate
	poolKey string
	state   *zoneState
}

func (z *zoneRef) release() {
	if z.state != nil {
		zones.Delete(z.poolKey)
		z.state = nil
	}
}

// definition is what a zone's counts mean: they are kept across a reload
// only while it is the same. Matchers are not part of it: a reload that
// changes which requests a zone judges keeps what it counted.
type definition struct {
	Key        string
	Events     float64
	Window     time.Duration
	Burst      float64
	Buckets    int
	NewKeysOff bool
}

// takeZones holds each zone of the handler in the pool, and the side Set
// it decides them with.
func (h *Handler) takeZones(ctx caddy.Context) error {
	engKey := "engine"
	switch {
	case h.Fleet != nil:
		f, err := takeFleet(h.Fleet, h.clock, h.seed)
		if err != nil {
			return err
		}
		h.fleet, h.eng, engKey = f, f.eng, f.key
	default:
		h.eng = engineFor(h.clock, h.seed)
		if h.clock != nil || h.seed != 0 {
			engKey = fmt.Sprintf("engine %p %d", h.clock, h.seed) // a test's own Engine
		}
	}
	side, err := takeSide(h.eng, engKey, h.buckets(), h.NewKeysOff)
	if err != nil {
		return err
	}
	h.side = side
	for _, name := range h.names() {
		z := h.Zones[name]
		kt, err := parseKey(z.Key)
		if err != nil {
			return fmt.Errorf("epochsketch: zone %q: key %q: %v", name, z.Key, err)
		}
		def, _ := json.Marshal(definition{z.Key, z.Events, time.Duration(z.Window), z.Burst, h.buckets(), h.NewKeysOff})
		where := "shared"
		if !z.Shared {
			where = h.loc.place
		}
		zid := fmt.Sprintf("%s|%q|%s", where, name, def)
		zid += "|" + strconv.Itoa(occurrence(ctx, engKey+"|"+zid, z.Shared))
		id := engKey + "|" + zid
		rule := name
		if h.fleet != nil {
			rule = fleetRule(name, zid)
		}
		sum := sha256.Sum256([]byte(id))
		ref := &zoneRef{name: name, zone: z, key: kt, poolKey: string(sum[:])}
		v, _, err := zones.LoadOrNew(ref.poolKey, func() (caddy.Destructor, error) {
			zside, err := takeSide(h.eng, engKey, h.buckets(), h.NewKeysOff)
			if err != nil {
				return nil, err
			}
			sp := spec(h.buckets(), h.NewKeysOff)
			// The policy keeps the zone's name where a fleet's rule
			// has a hash after it.
			lim := spconfig.LimitName(time.Duration(z.Window))
			sp.Rules = []engine.RuleSpec{{Name: rule, Limits: []engine.LimitSpec{{Name: lim, Policy: name + "-" + lim, Rate: z.rate()}}}}
			set, err := h.eng.Compile(sp, zside.set)
			if err != nil {
				zside.release()
				return nil, fmt.Errorf("epochsketch: zone %q: %v", name, err)
			}
			return &zoneState{set: set, rule: set.Rules[0], side: zside}, nil
		})
		if err != nil {
			return err
		}
		ref.state = v.(*zoneState)
		h.zones = append(h.zones, ref)
	}
	return nil
}

// seen counts, per config load and server (a caddy.Context's
// context.Context: Caddy gives each server's handlers one), the zones of
// each identity provisioned so far: two identical zones in one place (two
// directives of one route, or places locate cannot tell apart) are told
// apart by their order. Entries go when the config is unloaded.
var seen struct {
	sync.Mutex
	m map[context.Context]map[string]int
}

// occurrence returns how many zones of identity id this config load's
// server provisioned before this one. A shared zone is always the first:
// zones of one name and definition share one count.
func occurrence(ctx caddy.Context, id string, shared bool) int {
	if shared {
		return 0
	}
	seen.Lock()
	defer seen.Unlock()
	if seen.m == nil {
		seen.m = map[context.Context]map[string]int{}
	}
	c := ctx.Context
	m := seen.m[c]
	if m == nil {
		m = map[string]int{}
		seen.m[c] = m
		context.AfterFunc(c, func() {
			seen.Lock()
			delete(seen.m, c)
			seen.Unlock()
		})
	}
	n := m[id]
	m[id] = n + 1
	return n
}

// location is where the handler being provisioned sits.
type location struct {
	place string // the place of its zones (see above)
	// inErrors: the handler is in error routes. An error it returned
	// would never be handled (Caddy answers the first error's status,
	// empty), so it writes its refusals itself.
	inErrors bool
	// subErrors: an enclosing subroute (JSON only) has error routes of
	// its own, which see a returned error first.
	subErrors bool
	srv       *caddyhttp.Server // its server, nil outside one (tests)
}

// locate describes where the handler being provisioned sits: from the
// server's routes down through each enclosing subroute (handle,
// handle_path, route), the route that holds it. Routes are provisioned in
// order, and each route's handlers are loaded together, after which Caddy
// clears the route's raw handlers: the route being provisioned at a level
// is the first whose raw handlers are still there. It is described by its
// matchers (in any order).
func locate(ctx caddy.Context) location {
	var loc location
	var b strings.Builder
	level := func(routes caddyhttp.RouteList, errs *caddyhttp.HTTPErrorConfig) {
		switch {
		case describe(&b, "", routes):
		case errs != nil && describe(&b, "errors", errs.Routes):
			loc.inErrors = true
		default:
			b.WriteString(" ?") // a named route: its order tells it apart
		}
	}
	loc.srv, _ = ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if loc.srv != nil {
		level(loc.srv.Routes, loc.srv.Errors)
	}
	for _, m := range ctx.Modules() {
		if sr, ok := m.(*caddyhttp.Subroute); ok {
			level(sr.Routes, sr.Errors)
			loc.subErrors = loc.subErrors || sr.Errors != nil && len(sr.Errors.Routes) > 0
		}
	}
	loc.place = b.String()
	return loc
}

// describe writes the route of rs being provisioned now, if any, as
// " tag[matchers]".
func describe(b *strings.Builder, tag string, rs caddyhttp.RouteList) bool {
	cur := slices.IndexFunc(rs, func(r caddyhttp.Route) bool { return r.HandlersRaw != nil })
	if cur < 0 {
		return false
	}
	fmt.Fprintf(b, " %s%s", tag, matchers(rs[cur].MatcherSets))
	return true
}

// matchers describes matcher sets whatever the order of the matchers in a
// set (Caddy loads a set from a map): each matcher by its type and JSON.
func matchers(ms caddyhttp.MatcherSets) string {
	sets := make([]string, len(ms))
	for i, set := range ms {
		each := make([]string, len(set))
		for j, m := range set {
			js, err := json.Marshal(m)
			if err != nil {
				js = []byte("?")
			}
			each[j] = fmt.Sprintf("%T%s", m, js)
		}
		slices.Sort(each)
		sets[i] = strings.Join(each, " ")
	}
	return "[" + strings.Join(sets, " | ") + "]"
}

// logsPerSecond is the most refusals a zone logs a second; the next line
// says how many were left out.
const logsPerSecond = 10
