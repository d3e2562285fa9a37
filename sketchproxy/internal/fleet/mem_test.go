package fleet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// memStore is shareScript and the heartbeat in memory, on a test's clock:
// the same records, halvings and replies as Redis's (TestShareScriptMatchesMemory
// holds the two to it), so that the fleet's arithmetic runs on a manual
// clock with no network. Claims published are queued until the test
// delivers them (deliver), as the network would, late.
type memStore struct {
	mu      sync.Mutex
	now     func() time.Time
	keys    map[string]*memKey
	markers map[string]string
	members map[string]memberEntry // the members' hash (its entries' ts: µs)
	down    bool                   // every sync fails, as with Redis unreachable
	// paused: every sync fails (a timeout), but its commands run at
	// resume, late, as Redis stopped (SIGSTOP) runs what it has queued.
	paused bool
	late   []func()
	// oldBorn: every key's born reads as of long ago, as a writer without
	// the secret rewrites it (HSET key born 0): the field is unsigned.
	oldBorn bool

	listeners []memListener
	queued    []published // not yet delivered
	// quiet: heartbeats are not published (a fleet of replicas before
	// they were, or an ACL without PUBLISH on the members' channel).
	quiet bool
	// hot is the index of heavy keys (hotScript): each generation's
	// bitmap and when it expires; noIndex fails it, as an ACL without
	// its commands does.
	hot     map[string]*memHot
	noIndex bool
	// indexReads counts the index's reads (GETRANGE of both bitmaps).
	indexReads int
}

// memHot is one generation's bitmap of the index of heavy keys.
type memHot struct {
	bits    []byte
	expires time.Time
}

// memListener is a listen: its channel and where it delivers.
type memListener struct {
	channel string
	deliver func(payload string)
}

// published is a message on a channel.
type published struct{ channel, payload string }

type memKey struct {
	born int64
	recs map[string]signedRec
}

func newMemStore(now func() time.Time) *memStore {
	return &memStore{now: now, keys: map[string]*memKey{}, markers: map[string]string{}, members: map[string]memberEntry{}, hot: map[string]*memHot{}}
}

var errMemDown = errors.New("memStore: down")

func (m *memStore) sync(_ context.Context, r *shareRound, calls []shareCall, beat *heartbeat) ([]shareReply, *beatReply, int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	replies := make([]shareReply, len(calls))
	if m.down {
		return replies, nil, len(calls), errMemDown
	}
	if m.paused {
		m.late = append(m.late, func() { m.sync(context.Background(), r, calls, beat) })
		return replies, nil, len(calls), errMemDown
	}
	now := m.now()
	us := now.UnixMicro()
	for i, c := range calls {
		tick := now.UnixNano() / int64(c.tick)
		k := m.keys[c.rkey]
		if k == nil {
			k = &memKey{born: us, recs: map[string]signedRec{}}
			m.keys[c.rkey] = k
		}
		if m.oldBorn {
			k.born = 0
		}
		for _, g := range c.restore[:min(len(c.restore), maxRestore)] { // shareScript's HSETNX
			if _, ok := k.recs[g.id]; !ok && g.id != r.id {
				k.recs[g.id] = g
			}
		}
		rp := shareReply{ok: true, tick: tick, born: k.born, now: us}
		var ids []string
		for id := range k.recs {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		var others uint64
		for _, id := range ids {
			if id == r.id {
				continue
			}
			x := k.recs[id]
			cc, dd := halve(x.c, tick-x.at), halve(x.d, tick-x.at-1)
			ca := halve(x.c, min(tick, c.at)-x.at) // at the claim's tick (shareScript)
			if x.ts < us-r.stale.Microseconds() {
				dd = 0 // gone quiet: its count stays, halving
			}
			if cc == 0 && dd == 0 {
				delete(k.recs, id)
				others += uint64(ca)
				continue
			}
			rp.recs = append(rp.recs, x)
			gg := x.g
			if x.ts < us-r.stale.Microseconds() {
				gg = 0
			}
			others += uint64(max(ca, gg))
		}
		me := signedRec{id: r.id, c: c.c, d: c.d, g: c.g, at: c.at, ts: c.ts, mac: c.mac}
		if c.c1 > 0 && others+uint64(c.c1) <= uint64(c.limit) {
			me.c, me.mac = c.c1, c.mac1 // shareScript's conditional claim
		}
		k.recs[r.id] = me
		rp.recs = append(rp.recs, me)
		if _, ok := m.markers[c.marker]; !ok {
			m.markers[c.marker] = r.candidate
		}
		rp.run = m.markers[c.marker]
		replies[i] = rp
		if c.publish {
			var b strings.Builder
			fmt.Fprintf(&b, "%s %d %d %d", c.rkey, rp.tick, rp.born, rp.now)
			for _, p := range rp.recs {
				fmt.Fprintf(&b, " %s %s", p.id, p.String())
			}
			m.queued = append(m.queued, published{r.channel, b.String()})
		}
	}
	if x := r.index; x != nil {
		if m.noIndex {
			x.err = errors.New("NOPERM memStore: the index refused")
		} else {
			m.index(x, now)
		}
	}
	var br *beatReply
	if beat != nil {
		// As beatScript: the entry written, those out of the window of
		// now dropped, the rest returned.
		m.members[beat.id] = memberEntry{id: beat.id, ts: beat.ts, mac: beat.mac}
		if beat.channel != "" && !m.quiet {
			m.queued = append(m.queued, published{beat.channel, beat.id + " " + beat.entry()})
		}
		br = &beatReply{now: us}
		ids := slices.Sorted(maps.Keys(m.members))
		for _, id := range ids {
			e := m.members[id]
			if e.ts < us-beat.window.Microseconds() || e.ts > us+beat.window.Microseconds() {
				delete(m.members, id)
				continue
			}
			br.members = append(br.members, e)
		}
	}
	return replies, br, len(calls), nil
}

// index runs x as hotScript does, at now (m.mu held).
func (m *memStore) index(x *hotIndex, now time.Time) {
	for k, h := range m.hot {
		if !now.Before(h.expires) {
			delete(m.hot, k)
		}
	}
	if len(x.add) > 0 {
		h := m.hot[x.keys[0]]
		if h == nil {
			h = &memHot{}
			m.hot[x.keys[0]] = h
		}
		for _, b := range x.add {
			if need := int(b>>3) + 1; len(h.bits) < need {
				h.bits = append(h.bits, make([]byte, need-len(h.bits))...) // SETBIT grows the string
			}
			h.bits[b>>3] |= 0x80 >> (b & 7)
		}
		h.expires = now.Add(x.ttl)
	}
	x.bits, x.ok = nil, true
	if x.read {
		m.indexReads++
		x.bits = make([]byte, indexBits/8)
		for _, k := range x.keys {
			if h := m.hot[k]; h != nil {
				orBits(x.bits, string(h.bits))
			}
		}
	}
}

// deliver hands every queued claim to every listener.
func (m *memStore) deliver() {
	m.mu.Lock()
	q, ls := m.queued, m.listeners
	m.queued = nil
	m.mu.Unlock()
	for _, p := range q {
		for _, l := range ls {
			if l.channel == p.channel {
				l.deliver(p.payload)
			}
		}
	}
}

// flush loses everything, as a Redis restarted empty.
func (m *memStore) flush() {
	m.mu.Lock()
	m.keys, m.markers, m.members, m.hot = map[string]*memKey{}, map[string]string{}, map[string]memberEntry{}, map[string]*memHot{}
	m.mu.Unlock()
}

func (m *memStore) listen(channel string, deliver func(string), ready func(), _ func(error)) {
	m.mu.Lock()
	m.listeners = append(m.listeners, memListener{channel, deliver})
	m.mu.Unlock()
	ready()
}

func (m *memStore) close() {}

func (m *memStore) leave(_ context.Context, hb *heartbeat) error {
	m.mu.Lock()
	delete(m.members, hb.id)
	if hb.channel != "" && !m.quiet {
		m.queued = append(m.queued, published{hb.channel, hb.id + " " + hb.entry() + " left"})
	}
	m.mu.Unlock()
	return nil
}

// resume runs what was sent while paused, now, then answers again.
func (m *memStore) resume() {
	m.mu.Lock()
	late := m.late
	m.late, m.paused = nil, false
	m.mu.Unlock()
	for _, f := range late {
		f()
	}
}

// zero rewrites every replica's record of every key with its count,
// demand and guarantee 0, as a writer without the fleet's secret can
// (the record's MAC no longer matches it).
func (m *memStore) zero() {
	m.rewrite(func(r *signedRec) { r.c, r.d, r.g = 0, 0, 0 })
}

// rewrite applies edit to every replica's record of every key.
func (m *memStore) rewrite(edit func(r *signedRec)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range m.keys {
		for id, r := range k.recs {
			edit(&r)
			k.recs[id] = r
		}
	}
}

// del deletes every key's records (DEL of the hot hashes).
func (m *memStore) del() {
	m.mu.Lock()
	m.keys = map[string]*memKey{}
	m.mu.Unlock()
}

// zeroShares rewrites every replica's record of every key with its
// demand and guarantee zeroed, its count kept.
func (m *memStore) zeroShares() {
	m.rewrite(func(r *signedRec) { r.d, r.g = 0, 0 })
}

// zeroGuarantees rewrites every replica's record of every key with its
// guarantee zeroed, its count and demand kept.
func (m *memStore) zeroGuarantees() {
	m.rewrite(func(r *signedRec) { r.g = 0 })
}

// ghost adds to every key the record of a replica that does not exist,
// with a huge count, signed with a MAC made up.
func (m *memStore) ghost() {
	m.mu.Lock()
	defer m.mu.Unlock()
	us := m.now().UnixMicro()
	for _, k := range m.keys {
		k.recs["ghost"] = signedRec{id: "ghost", c: 1 << 20, d: 1 << 20, at: math.MaxInt32, ts: us, mac: strings.Repeat("0", 2*recMACSize)}
	}
}

// snapshot returns every record now; replay writes them back, as a
// writer without the secret can replay the records it has read.
func (m *memStore) snapshot() map[string]map[string]signedRec {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]map[string]signedRec{}
	for key, k := range m.keys {
		out[key] = maps.Clone(k.recs)
	}
	return out
}

func (m *memStore) replay(old map[string]map[string]signedRec) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for key, recs := range old {
		if k := m.keys[key]; k != nil {
			maps.Copy(k.recs, recs)
		}
	}
}
