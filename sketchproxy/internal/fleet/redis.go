package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// shareScript is one hot key's round on Redis, for one replica: it stores
// what the replica holds of the key (its count, its demand and its
// guarantee, at its tick, signed: fleet.sign), drops the records of
// replicas whose counts halved to nothing, and returns every replica's
// signed record as it wrote it, with Redis's tick and time (no skew
// between replicas: readers halve each record from its tick to Redis's),
// and the time the key was first shared (born). A demand is a rate (the
// count at the start of its tick, doubled: fleet.go, demand): it halves
// only from the tick after the next, as the replica's own would not halve
// while its requests go on. Each replica writes only its own record, and
// writes it whole: a round sent twice, or after Redis lost everything,
// counts nothing twice.
//
// A replica's record is two fields: s:<id>, "count demand guarantee tick
// time mac" as the replica signed them (what readers believe, once its MAC
// verifies: fleet.peersOf), and r:<id>, "count demand guarantee written
// tick" halved to Redis's tick, the form replicas before signed records
// read (their script drops a field it cannot parse), so that they still
// see this one's counts during a rolling upgrade. A replica's record is
// returned with its s: field, or "" where it has none (a replica of
// before, or a writer without the secret): readers do not count it.
//
// A replica gone quiet (its record's time older than stale µs: it left,
// or restarted under a new name, fleet.self) gives back its guarantee and
// its demand, but its count stays, halving, until nothing is left: it
// admitted those requests, and a replica that forgot them would admit
// them again. The script drops a record that has halved to nothing.
//
// It also keeps the run marker of the key's hash tag (KEYS[2], in the same
// slot): set only if absent, so only the first replica after a restart
// sets it, and returned, so a changed marker tells that Redis lost the
// tag's records. With a channel, it publishes the signed records, so that
// the other replicas see a claim on the pool before their next request
// (pcall: an ACL without the channel loses the claims' speed, not the
// round).
//
// A claim is conditional (ARGV[13] not empty): the count with the claim,
// its MAC and a limit. The script writes it only if it and what the other
// records hold (each its count, halved to now, or its guarantee if more;
// a replica gone quiet holds no guarantee) add up to at most the limit, and else
// the count without it (ARGV[3], as always). A claim that does not fit
// is then never in the record: before, it stayed there, refused, until it
// halved, and held room no request used (a claim of 1 a second over 3
// replicas held the whole limit). The script cannot tell a made-up record
// from a genuine one, so a made-up one can have a claim refused: the
// replica, which believes only the records that verify, sees that they
// left room, and claims again unconditionally (claim.go).
//
// KEYS[1] the hashed key, KEYS[2] its tag's marker; ARGV: the tick in µs,
// the replica's id, its count, demand and guarantee, the tick they are at,
// the TTL in ms, stale in µs, the candidate marker, the channel or "",
// the replica's time and the MAC; then the claim's count, its MAC and the
// limit, or "", "", ""; then, where Redis lost the records
// (Fleet.restoreLost), how many other replicas' records to write back
// where it holds none of theirs (64 at most), and each one's id and
// record as it signed it.
// No unpack of a list that fields written by someone else could make
// long: Lua unpacks at most 8,000 values, and a key past that would fail
// at every round.
// It returns "tick born now", the marker, then the id and the signed
// record of each replica, this one last.
const shareScript = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tick = math.floor(now / tonumber(ARGV[1]))
local function halveTo(v, from, to)
  local age = to - from
  if age <= 0 then return v end
  if age >= 32 then return 0 end
  return math.floor(v / 2 ^ age)
end
local function halve(v, from)
  return halveTo(v, from, tick)
end
local function slow(v, from)
  return halve(v, from + 1)
end
local id, stale = ARGV[2], now - tonumber(ARGV[8])
local at = math.min(tick, tonumber(ARGV[6])) -- the claim's tick, where earlier
for i = 1, math.min(tonumber(ARGV[16] or '0') or 0, 64) do -- maxRestore
  local gid, gs = ARGV[15 + 2 * i], ARGV[16 + 2 * i]
  if gid and gs and gid ~= id then redis.call('HSETNX', KEYS[1], 's:' .. gid, gs) end
end
local h = redis.call('HGETALL', KEYS[1])
local born, old, signed, who = nil, {}, {}, {}
for i = 1, #h, 2 do
  local f, v = h[i], h[i + 1]
  local kind, r = string.sub(f, 1, 2), string.sub(f, 3)
  if f == 'born' then
    born = tonumber(v)
  elseif r ~= id and (kind == 'r:' or kind == 's:') then
    if not old[r] and not signed[r] then who[#who + 1] = r end
    if kind == 'r:' then old[r] = v else signed[r] = v end
  end
end
local out, gone, others = {}, {}, 0
for _, r in ipairs(who) do
  local s, c, d, g, w, tk = signed[r] or ''
  c, d, g, tk, w = string.match(s, '^(%d+) (%d+) (%d+) (%d+) (%d+) %x+$')
  if not c then
    s = ''
    c, d, g, w, tk = string.match(old[r] or '', '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
  end
  local ca
  if c then
    ca = halveTo(tonumber(c), tonumber(tk), at)
    c, d, g = halve(tonumber(c), tonumber(tk)), slow(tonumber(d), tonumber(tk)), tonumber(g)
    if tonumber(w) < stale then d, g = 0, 0 end
  end
  if not c or (c == 0 and d == 0) then
    gone[#gone + 1] = 'r:' .. r
    gone[#gone + 1] = 's:' .. r
    others = others + (ca or 0)
  else
    out[#out + 1] = r
    out[#out + 1] = s
    others = others + math.max(ca, g)
  end
end
for i = 1, #gone, 1000 do
  redis.call('HDEL', KEYS[1], unpack(gone, i, math.min(i + 999, #gone)))
end
local cw, mac = ARGV[3], ARGV[12]
if ARGV[13] and ARGV[13] ~= '' and others + tonumber(ARGV[13]) <= tonumber(ARGV[15]) then
  cw, mac = ARGV[13], ARGV[14]
end
local c = halve(tonumber(cw), tonumber(ARGV[6]))
local d = slow(tonumber(ARGV[4]), tonumber(ARGV[6]))
local mine = table.concat({cw, ARGV[4], ARGV[5], ARGV[6], ARGV[11], mac}, ' ')
redis.call('HSET', KEYS[1], 'r:' .. id, string.format('%d %d %d %d %d', c, d, tonumber(ARGV[5]), now, tick), 's:' .. id, mine)
if not born then
  born = now
  redis.call('HSET', KEYS[1], 'born', string.format('%d', born))
end
redis.call('PEXPIRE', KEYS[1], ARGV[7])
redis.call('SET', KEYS[2], ARGV[9], 'NX')
out[#out + 1] = id
out[#out + 1] = mine
local head = string.format('%d %d %d', tick, born, now)
if ARGV[10] ~= '' then
  local claim = {KEYS[1], head}
  for i = 1, #out, 2 do
    if out[i + 1] ~= '' then claim[#claim + 1] = out[i] .. ' ' .. out[i + 1] end
  end
  pcall(redis.call, 'PUBLISH', ARGV[10], table.concat(claim, ' '))
end
local res = {head, redis.call('GET', KEYS[2])}
for i = 1, #out do res[#res + 1] = out[i] end
return res
`

// beatScript is the heartbeat in one command, on Redis's clock, as the
// records are (on the replicas' own clocks, one ahead by more than the
// window dropped the others' entries and counted itself alone). Its
// members are signed: KEYS[2], a hash in KEYS[1]'s slot, holds each
// replica's entry "ts mac" (the time it sent it, its reckoning of Redis's
// clock in µs, and a MAC over the hash's name, its id and ts), and the
// script returns Redis's time (µs) and every entry within the window of
// now, dropping the others; the replica counts those that verify
// (Fleet.countMembers). Anyone may write to the hash, but no entry it
// makes up verifies, and one replayed is out of the window by its signed
// time: a members' set anyone could add to made every replica count more
// peers and refuse more. KEYS[1], the sorted set that replicas before
// signed members count (ZCARD), gets this replica's entry too, so that
// they still count it. Where ARGV[4] names a channel, the entry is
// published there too ("id ts mac"), first, so that a members' key of
// another type (the script fails at it) does not silence it: the others
// hear it even when the hash is flushed or deleted as often as the
// replicas beat, which left the replica that beat just before the others
// (theirs written an interval earlier, a flush since) seeing only itself.
// ARGV: the id, the window in ms, the entry, the channel.
const beatScript = `
if ARGV[4] and ARGV[4] ~= '' then
  pcall(redis.call, 'PUBLISH', ARGV[4], ARGV[1] .. ' ' .. ARGV[3])
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local w = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%d', now - w))
redis.call('ZREMRANGEBYSCORE', KEYS[1], string.format('(%d', now), '+inf')
redis.call('PEXPIRE', KEYS[1], 60000)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {string.format('%d', us)}
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local ts = tonumber(string.match(all[i + 1], '^(%d+) ') or '')
  if not ts or ts < us - w * 1000 or ts > us + w * 1000 then
    redis.call('HDEL', KEYS[2], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
redis.call('PEXPIRE', KEYS[2], 60000)
return out
`

// shareRound is what every call of one round shares.
type shareRound struct {
	id        string        // this replica
	candidate string        // its run marker, should Redis have none
	channel   string        // where claims are published
	stale     time.Duration // a record unwritten this long is a replica gone
	ttl       time.Duration // at least: a key's records outlive a few rounds
	index     *hotIndex     // the index of heavy keys' part in a round, or nil (index.go)
}

// shareCall is one hot key's record, for one round.
type shareCall struct {
	rkey, marker string
	tick         time.Duration
	c, d, g      uint32
	at           int64 // the tick c and d are at
	ts           int64 // this replica's reckoning of Redis's time (µs)
	mac          string
	publish      bool // a claim on the pool: the others hear of it at once
	// A conditional claim (c1 > 0): c1 is written, signed mac1, only if
	// it and what the others' records hold add up to at most limit; else
	// c.
	c1, limit uint32
	mac1      string
	// restore: other replicas' records to write back first where Redis
	// holds none of theirs (Fleet.restoreLost).
	restore []signedRec
}

// wrote reports whether reply rp shows replica id's record holding c:
// its conditional claim written.
func (rp *shareReply) wrote(id string, c uint32) bool {
	for i := len(rp.recs) - 1; i >= 0; i-- {
		if rp.recs[i].id == id {
			return rp.recs[i].c == c
		}
	}
	return false
}

// claimArgs are c's conditional claim's arguments to shareScript.
func (c *shareCall) claimArgs() (c1, mac1, limit string) {
	if c.c1 == 0 {
		return "", "", ""
	}
	return strconv.FormatUint(uint64(c.c1), 10), c.mac1, strconv.FormatUint(uint64(c.limit), 10)
}

// shareReply is Redis's answer to one call, or a claim another replica
// published: every replica's record of the key as it signed it (recs),
// and, once read (fleet.peersOf), the records believed, halved to tick
// (peers).
type shareReply struct {
	ok        bool // the key's node answered
	tick      int64
	born, now int64 // Redis's time (µs) of the key's first round, and of this
	run       string
	recs      []signedRec
	peers     []peerShare
	rejected  int // records peersOf did not believe
	// claim: published, read from the channel; verified: recs holds
	// only records whose MAC verified (hear checks a claim's at once).
	claim, verified bool
}

// signedRec is one replica's record as it wrote it: its count and demand
// at its tick at, its guarantee, and ts, its reckoning of Redis's time
// when it sent them (µs, increasing at each send), with the MAC of all of
// them and of the key's name, keyed with the fleet's secret (fleet.sign).
// unsigned: a record without one (a replica of before signed records).
type signedRec struct {
	id       string
	c, d, g  uint32
	at, ts   int64
	mac      string
	unsigned bool
}

// String is the record as Redis holds it (s:<id>) and as claims carry it.
func (r *signedRec) String() string {
	return fmt.Sprintf("%d %d %d %d %d %s", r.c, r.d, r.g, r.at, r.ts, r.mac)
}

// parseSigned reads a record as String writes it; ok is false if it is
// not one.
func parseSigned(id string, w []string) (r signedRec, ok bool) {
	if len(w) != 6 || len(w[5]) != 2*recMACSize {
		return signedRec{}, false
	}
	var err [5]error
	var v [3]uint64
	for i := range v {
		v[i], err[i] = strconv.ParseUint(w[i], 10, 32)
	}
	r = signedRec{id: id, c: uint32(v[0]), d: uint32(v[1]), g: uint32(v[2]), mac: w[5]}
	r.at, err[3] = strconv.ParseInt(w[3], 10, 64)
	r.ts, err[4] = strconv.ParseInt(w[4], 10, 64)
	return r, errors.Join(err[:]...) == nil
}

// fleetStore is where the replicas' records meet: Redis, or a test's
// memory. One sync goroutine calls sync; listen runs on its own.
type fleetStore interface {
	// sync sends calls (with beat, this replica's heartbeat too, and
	// then returns the members' entries it read, nil where Redis did not
	// answer it), reporting the commands sent. A reply whose node did not
	// answer has ok false.
	sync(ctx context.Context, r *shareRound, calls []shareCall, beat *heartbeat) (replies []shareReply, members *beatReply, commands int, err error)
	// listen delivers each message published on channel (the claims',
	// or the heartbeats') until close; ready is called each time it
	// (re)subscribes.
	listen(channel string, deliver func(payload string), ready func(), failed func(error))
	close()
	// leave removes hb's replica (its leave signed: signLeave) from the
	// members, and publishes its leave on hb.channel: a replica that
	// stops is not counted until its heartbeat leaves the window.
	leave(ctx context.Context, hb *heartbeat) error
}

// heartbeat is this replica's entry in the members' sorted set (key)
// and its signed entry in the members' hash (signedKey): ts, its
// reckoning of Redis's time (µs), and mac (Fleet.signBeat); published on
// channel too ("" none).
type heartbeat struct {
	key, signedKey, id, channel string
	now                         time.Time     // the test store's clock; Redis counts on its own
	window                      time.Duration // members older than this are gone
	ts                          int64
	mac                         string
}

// entry is the heartbeat's value in the members' hash.
func (h *heartbeat) entry() string { return strconv.FormatInt(h.ts, 10) + " " + h.mac }

// beatReply is what the heartbeat read: Redis's time (µs) and the
// entries of the members' hash within the window, not yet verified.
type beatReply struct {
	now     int64
	members []memberEntry
}

// memberEntry is one replica's entry in the members' hash.
type memberEntry struct {
	id, mac string
	ts      int64
}

// parseBeatReply reads beatScript's reply: Redis's time, then the
// entries' ids and values. ok is false if it is not one.
func parseBeatReply(v []any) (br beatReply, ok bool) {
	if len(v) == 0 || len(v)%2 != 1 {
		return br, false
	}
	s, _ := v[0].(string)
	now, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return br, false
	}
	br.now = now
	for i := 1; i+1 < len(v); i += 2 {
		id, _ := v[i].(string)
		val, _ := v[i+1].(string)
		tsWord, mac, found := strings.Cut(val, " ")
		ts, err := strconv.ParseInt(tsWord, 10, 64)
		if !found || err != nil || id == "" {
			br.members = append(br.members, memberEntry{id: id}) // rejected when counted
			continue
		}
		br.members = append(br.members, memberEntry{id: id, mac: mac, ts: ts})
	}
	return br, true
}

// redisStore is the fleet's Redis: one script call per hot key, pipelined
// (one pipeline per node on a Cluster), and a subscription to the claims.
type redisStore struct {
	rdb               redis.UniversalClient
	script, beat, hot *redis.Script

	mu     sync.Mutex
	ps     []*redis.PubSub // one a listen
	closed bool
}

func newRedisStore(o *redis.UniversalOptions) *redisStore {
	return &redisStore{rdb: redis.NewUniversalClient(o), script: redis.NewScript(shareScript), beat: redis.NewScript(beatScript), hot: redis.NewScript(hotScript)}
}

func (s *redisStore) sync(ctx context.Context, r *shareRound, calls []shareCall, beat *heartbeat) ([]shareReply, *beatReply, int, error) {
	sent := 0
	var all []redis.Cmder // every command of the last pipeline
	// exec sends the round; with eval, as EVAL (which also caches the
	// scripts), not EVALSHA.
	var idx *redis.Cmd // the index's part (index.go), or nil
	exec := func(eval bool) ([]*redis.Cmd, *redis.Cmd, error) {
		run := func(sc *redis.Script, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
			if eval {
				return sc.Eval(ctx, c, keys, args...)
			}
			return sc.EvalSha(ctx, c, keys, args...)
		}
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(calls))
		for i, c := range calls {
			channel := ""
			if c.publish {
				channel = r.channel
			}
			c1, mac1, limit := c.claimArgs()
			args := []any{strconv.FormatFloat(float64(c.tick)/float64(time.Microsecond), 'f', -1, 64),
				r.id, c.c, c.d, c.g, c.at, max(4*c.tick, r.ttl).Milliseconds(), r.stale.Microseconds(), r.candidate, channel, c.ts, c.mac,
				c1, mac1, limit}
			if len(c.restore) > 0 {
				args = append(args, len(c.restore))
				for _, g := range c.restore {
					args = append(args, g.id, g.String())
				}
			}
			cmds[i] = run(s.script, pipe, []string{c.rkey, c.marker}, args...)
		}
		if len(calls) == 0 {
			pipe.Ping(ctx) // no hot keys: still learn whether Redis answers
		}
		var card *redis.Cmd
		if beat != nil {
			card = run(s.beat, pipe, []string{beat.key, beat.signedKey}, beat.id, beat.window.Milliseconds(), beat.entry(), beat.channel)
		}
		if x := r.index; x != nil {
			args := make([]any, 0, 3+len(x.add))
			read := "0"
			if x.read {
				read = "1"
			}
			args = append(args, x.ttl.Milliseconds(), read, indexBits/8)
			for _, b := range x.add {
				args = append(args, b)
			}
			idx = run(s.hot, pipe, x.keys[:], args...)
		}
		sent += pipe.Len()
		var err error
		all, err = pipe.Exec(ctx)
		return cmds, card, err
	}
	cmds, card, err := exec(false)
	if err != nil && slices.ContainsFunc(all, func(c redis.Cmder) bool { return redis.HasErrorPrefix(c.Err(), "NOSCRIPT") }) {
		// A new, restarted or promoted node has no scripts: send the
		// round again as EVAL, which caches them on the node that runs
		// each (every node of a Cluster in turn), in one round trip
		// where loading them first took two and could run past the
		// round's timeout on a busy machine.
		cmds, card, err = exec(true)
	}
	if err != nil && keysOnly(all, idx) {
		// Redis answered; only some keys' records could not be read (a key
		// of another type under the prefix), or the index of heavy keys
		// failed (an ACL without its commands, a key of another type):
		// those keys are not synced, a replica in its warm-up reads no
		// index, and the round is good for the others.
		err = nil
	}
	if x := r.index; x != nil && idx != nil && err == nil {
		x.err = idx.Err()
		x.ok = x.err == nil
		if x.ok && x.read {
			x.bits = make([]byte, indexBits/8)
			v, _ := idx.StringSlice()
			for _, b := range v {
				orBits(x.bits, b)
			}
		}
	}
	replies := make([]shareReply, len(calls))
	for i := range calls {
		v, cerr := cmds[i].Slice()
		if cerr == nil {
			replies[i] = parseShareReply(v)
		}
	}
	var members *beatReply
	if card != nil && err == nil {
		if v, cerr := card.Slice(); cerr == nil {
			if br, ok := parseBeatReply(v); ok {
				members = &br
			}
		}
	}
	return replies, members, sent, err
}

// keysOnly reports whether every command that failed, failed because of
// its key alone: Redis answered WRONGTYPE (something else wrote a key of
// another type under the fleet's prefix), or it is idx, the index of
// heavy keys, which a round does without. Other errors (a connection, a
// timeout, LOADING, READONLY, a Cluster node down) fail the round, as the
// first failed command's error does a pipeline.
func keysOnly(all []redis.Cmder, idx *redis.Cmd) bool {
	if len(all) == 0 {
		return false
	}
	for _, c := range all {
		if c.Err() == nil || idx != nil && c == redis.Cmder(idx) {
			continue
		}
		var re redis.Error
		if !errors.As(c.Err(), &re) || !strings.Contains(c.Err().Error(), "WRONGTYPE") {
			return false
		}
	}
	return true
}

// parseShareReply reads shareScript's reply; ok is false if it is not one.
// A record that is not in the signed form is kept, unsigned: readers
// count it as rejected, and do not believe it.
func parseShareReply(v []any) shareReply {
	var r shareReply
	if len(v) < 2 || (len(v)-2)%2 != 0 {
		return r
	}
	head, ok := v[0].(string)
	if !ok || !r.head(head) {
		return r
	}
	r.run, _ = v[1].(string)
	for i := 2; i+1 < len(v); i += 2 {
		id, ok1 := v[i].(string)
		s, ok2 := v[i+1].(string)
		if !ok1 || !ok2 {
			return shareReply{}
		}
		rec, ok := parseSigned(id, strings.Fields(s))
		if !ok {
			rec = signedRec{id: id, unsigned: true}
		}
		r.recs = append(r.recs, rec)
	}
	r.ok = true
	return r
}

// parseClaim reads a published claim: the hashed key, the script's head
// ("tick born now"), then each replica's id and signed record. ok is
// false if it is not one (a claim of a replica before signed records is
// not).
func parseClaim(payload string) (rkey string, r shareReply, ok bool) {
	w := strings.Fields(payload)
	if len(w) < 4 || (len(w)-4)%7 != 0 || !r.head(strings.Join(w[1:4], " ")) {
		return "", shareReply{}, false
	}
	for i := 4; i+6 < len(w); i += 7 {
		rec, ok := parseSigned(w[i], w[i+1:i+7])
		if !ok {
			return "", shareReply{}, false
		}
		r.recs = append(r.recs, rec)
	}
	r.ok, r.claim = true, true
	return w[0], r, true
}

// head reads "tick born now".
func (r *shareReply) head(s string) bool {
	w := strings.Fields(s)
	if len(w) != 3 {
		return false
	}
	var err [3]error
	r.tick, err[0] = strconv.ParseInt(w[0], 10, 64)
	r.born, err[1] = strconv.ParseInt(w[1], 10, 64)
	r.now, err[2] = strconv.ParseInt(w[2], 10, 64)
	return err[0] == nil && err[1] == nil && err[2] == nil
}

// listen subscribes to channel and delivers each message until close,
// resubscribing after an error (Redis restarted, a failover) with a wait
// that doubles up to 5 s.
func (s *redisStore) listen(channel string, deliver func(string), ready func(), failed func(error)) {
	ctx := context.Background()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	ps := s.rdb.Subscribe(ctx, channel)
	s.ps = append(s.ps, ps)
	s.mu.Unlock()
	wait := 100 * time.Millisecond
	for {
		msg, err := ps.Receive(ctx)
		if err != nil {
			if errors.Is(err, redis.ErrClosed) {
				return
			}
			failed(err)
			time.Sleep(wait)
			wait = min(2*wait, 5*time.Second)
			continue
		}
		wait = 100 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Message:
			deliver(m.Payload)
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				ready()
			}
		}
	}
}

func (s *redisStore) leave(ctx context.Context, hb *heartbeat) error {
	pipe := s.rdb.Pipeline()
	pipe.HDel(ctx, hb.signedKey, hb.id)
	// Replicas before signed members prune an entry dated 0 at their
	// next heartbeat (ZREM is not in the documented ACL).
	pipe.ZAdd(ctx, hb.key, redis.Z{Score: 0, Member: hb.id})
	var pub *redis.IntCmd
	if hb.channel != "" {
		pub = pipe.Publish(ctx, hb.channel, hb.id+" "+hb.entry()+" left")
	}
	cmds, err := pipe.Exec(ctx)
	if err != nil && pub != nil && pub.Err() != nil && redis.HasErrorPrefix(pub.Err(), "NOPERM") {
		// An ACL without the members' channel: the others do not hear
		// the heartbeats either, and the entry is gone from the hash.
		err = nil
		for _, c := range cmds {
			if c != pub && c.Err() != nil {
				err = c.Err()
				break
			}
		}
	}
	return err
}

func (s *redisStore) close() {
	s.mu.Lock()
	s.closed = true // a listen that starts late returns at once
	for _, ps := range s.ps {
		ps.Close()
	}
	s.mu.Unlock()
	s.rdb.Close()
}
