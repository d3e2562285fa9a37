package fleet

import (
	"encoding/binary"
	"fmt"
	"slices"
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
// So each replica's round also marks its heavy keys (hot here, their
// fleet-wide count at least half of θ in its view) in a bitmap under the
// prefix, one per indexGeneration, each key once a generation; and a
// replica in its warm-up reads this generation's bitmap and the one
// before at each round. A key
// whose bit is set joins the hot set at its first request here, which
// claims (claim.go) and so is decided from the others' records: a restart
// adds nothing of a key held at its limit. A key's bit is given by the
// first 8 bytes of its name in Redis (HMAC-SHA256 of the secret, the
// sketch key and its limit): the index names nothing the records' own
// names do not. The bitmap is indexBits long, whatever anyone writes
// there: a round reads at most indexBits/8 bytes of each (GETRANGE) and
// sets single bits (SETBIT), so no value under the key (a string of
// 512 MB, a hash of a million fields) makes a round slower. A first
// build kept the tags in a hash, read whole with HGETALL: a writer
// without the secret that filled it with a million fields made every
// replica's round pass the timeout, for good (a review). Nothing is
// signed: a writer without the secret can set bits (mice then claim
// during a warm-up, a round trip each, refused only as any claim is) or
// clear them (the warm-up then adds two requests of a key at its limit,
// as before the index), never make a key lighter. Keys share a bit now
// and then (a key heavy nowhere read as heavy: 2% to 4% at 20,000 keys
// marked in each of the two generations read), which costs that key a
// claim in a warm-up.

// hotScript sets bits in this generation's bitmap (KEYS[1]) and, where
// ARGV[2] is '1', returns the first ARGV[3] bytes of both generations'
// bitmaps (KEYS[2], the generation before): GETRANGE, whatever is
// there. Both are in one slot (their hash tag). ARGV: the bitmap's TTL in
// ms, '1' to read, the bytes to read, then the bits to set.
const hotScript = `
for i = 4, #ARGV do
  redis.call('SETBIT', KEYS[1], ARGV[i], 1)
end
if #ARGV > 3 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
if ARGV[2] ~= '1' then return {} end
local last = tonumber(ARGV[3]) - 1
return {redis.call('GETRANGE', KEYS[1], 0, last), redis.call('GETRANGE', KEYS[2], 0, last)}
`

// hotIndex is a round's part in the index: the bits it sets in this
// generation's bitmap, and whether it reads both generations' back. The
// store fills bits (both bitmaps ORed, indexBits long) and ok (Redis
// answered it).
type hotIndex struct {
	keys [2]string // this generation's bitmap, and the one before
	ttl  time.Duration
	add  []uint32
	read bool
	gen  int64       // this generation
	es   []*hotEntry // whose bits add holds

	bits []byte
	ok   bool
	err  error // why Redis refused it, where it answered the round
}

// indexGeneration is how long a generation of the index lasts, on Redis's
// clock as each replica reckons it (its own until Redis first answers
// it): fixed, not the replicas' interval, so that replicas whose
// intervals differ (a rolling change of it) read and write the same
// bitmaps (a review), and no shorter than the longest interval (a
// minute), so that every replica marks its heavy keys in each. A replica
// reads the two newest, so a key heavy in the last one to two minutes is
// marked.
const indexGeneration = time.Minute

// indexBits is the bitmap's length: 128 KiB a generation, read whole in a
// warm-up's rounds; at 20,000 heavy keys 2% of the others share a bit
// with one.
const indexBits = 1 << 20

// indexBit is the index's bit of a key whose HMAC is sum (keySum).
func indexBit(sum []byte) uint32 {
	return uint32(binary.BigEndian.Uint64(sum[:8]) & (indexBits - 1))
}

// orBits ORs b, a bitmap as Redis holds it (bit 0 the high bit of byte
// 0), into into (indexBits/8 long); a longer b is cut, a shorter one is
// zeros past its end (GETRANGE).
func orBits(into []byte, b string) {
	for i := range min(len(into), len(b)) {
		into[i] |= b[i]
	}
}

// indexOp is the index's part in a round that sends es at now: the bits of
// the heavy keys not yet set in this generation, and a read while this
// replica is in its warm-up (or has had no answer yet). nil where there is
// nothing to do.
func (f *Fleet) indexOp(es []*hotEntry, now time.Time) *hotIndex {
	gen := f.redisClock() / indexGeneration.Microseconds()
	warm := f.warmUntil.Load()
	op := &hotIndex{
		keys: [2]string{f.indexKey(gen), f.indexKey(gen - 1)},
		ttl:  3 * indexGeneration,
		read: warm == 0 || now.UnixNano() < warm,
		gen:  gen,
	}
	if !op.read && f.heavyBits.Load() != nil {
		f.heavyBits.Store(nil) // the warm-up is over
	}
	if op.read && warm == idleWarm && now.UnixNano()-f.indexReadAt.Load() < int64(f.stale()) {
		// No request yet: the bitmaps are read every stale(), not every
		// round (256 KiB each time), and kept.
		op.read = false
	}
	if f.indexRefused.Load() != gen+1 { // refused in this generation: not sent again until the next
		for _, e := range es {
			if e.indexGen.Load() != gen+1 && e.heavy(now) {
				op.add = append(op.add, e.bit)
				op.es = append(op.es, e)
			}
		}
	}
	if !op.read && len(op.add) == 0 {
		return nil
	}
	return op
}

// indexKey is the name of generation gen's bitmap: under the prefix (an
// ACL's key pattern), every generation in one slot.
func (f *Fleet) indexKey(gen int64) string {
	return f.cfg.Prefix + "{" + f.cfg.Prefix + "hot}:" + strconv.FormatInt(gen, 10)
}

// noteIndex takes what Redis answered of op, in a round Redis answered:
// the bits set are not sent again this generation, and the bitmaps read
// mark the heavy keys of the warm-up (nil where no bit is set: no HMAC
// for a request then). An index Redis refused is warned once, and not
// sent again in its generation.
func (f *Fleet) noteIndex(op *hotIndex) {
	if op == nil {
		return
	}
	if !op.ok {
		f.indexRefused.Store(op.gen + 1)
		if !f.indexWarned.Swap(true) {
			f.log.Warn("fleet: Redis refused the index of heavy keys (an ACL without +setbit and +getrange, or a key of another type under its name): a replica restarted without a state_file may admit 2 requests of each key the fleet holds at its limit", "index", op.keys[0], "err", fmt.Sprint(op.err))
		}
		return
	}
	for _, e := range op.es {
		e.indexGen.Store(op.gen + 1)
	}
	if op.read {
		f.indexReadAt.Store(f.now().UnixNano())
		if len(op.bits) == indexBits/8 && slices.ContainsFunc(op.bits, func(b byte) bool { return b != 0 }) {
			f.heavyBits.Store(&op.bits)
		} else {
			f.heavyBits.Store(nil)
		}
	}
}

// indexed reports whether the key skey of a limit of tick and theta is
// marked in the index this replica read in its warm-up: one HMAC (keySum,
// no allocation), only while the index read has any bit set.
func (f *Fleet) indexed(skey []byte, tick time.Duration, theta uint32) bool {
	bm := f.heavyBits.Load()
	if bm == nil {
		return false
	}
	sum := f.keySum(skey, tick, theta)
	b := indexBit(sum[:])
	return (*bm)[b>>3]&(0x80>>(b&7)) != 0
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
