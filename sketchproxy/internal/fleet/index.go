package fleet

import (
	"encoding/hex"
	"strconv"
	"time"
)

// The index of heavy keys: a replica that has just started (restarted
// without a state file, or joined) has counted nothing of a key the others
// hold at its limit, and below its promotion point it would decide the
// key alone. During its warm-up (fleetWarmPoint) a key joined its hot set
// at its third request, so a restart added two requests of each key held
// at its limit (22 of 20 over 3 replicas on a real redis-server,
// TestFleetProcessRestartHeldKey at d54c15b). Listing the hot keys with SCAN at start was tried and taken
// out (it lets the fleet's Redis user list every key name in the
// database, and on a Redis with a million other keys it took the whole
// start's bound and still missed keys).
//
// So each replica's round also writes the tags of its heavy keys (hot
// here, their fleet-wide count at least half of θ in its view) to a hash
// under the prefix, one per generation of stale() (Redis's time, as this
// replica reckons it), each tag once a generation; and a replica in its
// warm-up reads this generation's hash and the one before at each round.
// A key whose tag is there joins the hot set at its first request here,
// which claims (claim.go) and so is decided from the others' records: a
// restart adds nothing of a key held at its limit. A tag is the first 8
// bytes of the key's name in Redis (HMAC-SHA256 of the secret, the sketch
// key and its limit), in hex: the index names nothing the records' own
// names do not. Nothing is signed: a writer without the secret can add
// tags (mice then claim during a warm-up, which costs a round trip and
// refuses nothing a claim would not) or delete them (the warm-up then
// adds two requests of a key at its limit, as before the index), never
// make a key lighter. The hash holds at most the keys heavy in two
// generations, max_hot a replica; a replica keeps at most indexReadMax
// tags of it.

// hotScript writes tags to this generation's hash (KEYS[1]) and, where
// ARGV[2] is '1', returns the tags of both generations' hashes (KEYS[2],
// the generation before). Both are in one slot (their hash tag). ARGV:
// the hash's TTL in ms, '1' to read, then the tags. HSET's arguments go a
// thousand tags at a time: Lua unpacks at most 8,000 values.
const hotScript = `
for i = 3, #ARGV, 1000 do
  local t = {}
  for j = i, math.min(i + 999, #ARGV) do
    t[#t + 1] = ARGV[j]
    t[#t + 1] = '1'
  end
  redis.call('HSET', KEYS[1], unpack(t))
end
if #ARGV > 2 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
if ARGV[2] ~= '1' then return {} end
local out = {}
for _, k in ipairs(KEYS) do
  local all = redis.call('HGETALL', k)
  for i = 1, #all, 2 do out[#out + 1] = all[i] end
end
return out
`

// hotIndex is a round's part in the index: the tags it adds to this
// generation's hash, and whether it reads both generations' back. The
// store fills tags and ok (Redis answered it).
type hotIndex struct {
	keys [2]string // this generation's hash, and the one before
	ttl  time.Duration
	add  []string
	read bool
	gen  int64       // this generation
	es   []*hotEntry // whose tags add holds

	tags []string
	ok   bool
}

// indexReadMax is the most tags a replica keeps from the index: twice
// max_hot's bound for each of 16 replicas would be more than it needs; a
// hash made long by a writer without the secret costs no more than this.
const indexReadMax = 1 << 18

// indexTagSize is a tag's bytes of the key's HMAC (16 hex digits).
const indexTagSize = 8

// indexTag is the index's tag of a key whose HMAC is sum (redisKeys).
func indexTag(sum []byte) string { return hex.EncodeToString(sum[:indexTagSize]) }

// indexOp is the index's part in a round that sends es at now: the tags of
// the heavy keys not yet written in this generation, and a read while this
// replica is in its warm-up (or has had no answer yet). nil where there is
// nothing to do.
func (f *Fleet) indexOp(es []*hotEntry, now time.Time) *hotIndex {
	gen := f.redisClock() / f.stale().Microseconds()
	warm := f.warmUntil.Load()
	op := &hotIndex{
		keys: [2]string{f.indexKey(gen), f.indexKey(gen - 1)},
		ttl:  3 * f.stale(),
		read: warm == 0 || now.UnixNano() < warm,
		gen:  gen,
	}
	if !op.read && f.heavyTags.Load() != nil {
		f.heavyTags.Store(nil) // the warm-up is over
	}
	for _, e := range es {
		if e.indexGen.Load() != gen && e.heavy(now) {
			op.add = append(op.add, e.tag)
			op.es = append(op.es, e)
		}
	}
	if !op.read && len(op.add) == 0 {
		return nil
	}
	return op
}

// indexKey is the name of generation gen's hash: under the prefix (an
// ACL's key pattern), every generation in one slot.
func (f *Fleet) indexKey(gen int64) string {
	return f.cfg.Prefix + "{" + f.cfg.Prefix + "hot}:" + strconv.FormatInt(gen, 10)
}

// noteIndex takes what Redis answered of op: the tags written are not
// sent again this generation, and the tags read are the heavy keys of the
// warm-up.
func (f *Fleet) noteIndex(op *hotIndex) {
	if op == nil || !op.ok {
		return
	}
	for _, e := range op.es {
		e.indexGen.Store(op.gen)
	}
	if op.read {
		set := make(map[string]struct{}, min(len(op.tags), indexReadMax))
		for _, t := range op.tags {
			if len(set) >= indexReadMax {
				break
			}
			if len(t) == 2*indexTagSize {
				set[t] = struct{}{}
			}
		}
		f.heavyTags.Store(&set)
	}
}

// indexed reports whether the key skey of a limit of tick and theta is in
// the index this replica read in its warm-up: one HMAC, only while the
// index read holds any tag.
func (f *Fleet) indexed(skey []byte, tick time.Duration, theta uint32) bool {
	set := f.heavyTags.Load()
	if set == nil || len(*set) == 0 {
		return false
	}
	_, ok := (*set)[indexTag(f.keySum(skey, tick, theta))]
	return ok
}

// heavy reports whether e's fleet-wide count, in its view at now, is at
// least half of θ: a key the others may hold at its limit, which a replica
// just started must not decide alone.
func (e *hotEntry) heavy(now time.Time) bool {
	v := e.view.Load()
	if v == nil {
		return false
	}
	tk := now.UnixNano() / int64(e.tick)
	return uint64(v.withOthers(e.sk.EstimateBytes(e.skey), tk))*2 >= uint64(e.theta)
}
