package engine

import (
	"crypto/sha256"
	"slices"
)

// Scratch is one request's working memory: the sketch keys it builds, its
// verdicts and their counts, the places it holds and the RateLimit field.
// Reuse one per request (Reset once the request is done, after
// Decision.Done) and a decision allocates nothing.
type Scratch struct {
	buf      []byte
	nums     []uint32
	verdicts []Verdict
	places   []place
	field    []byte
}

// Reset empties sc for the next request.
func (sc *Scratch) Reset() {
	sc.buf = sc.buf[:0]
	sc.nums = sc.nums[:0]
	clear(sc.verdicts) // no rule or key outlives its request
	sc.verdicts = sc.verdicts[:0]
	clear(sc.places)
	sc.places = sc.places[:0]
	sc.field = sc.field[:0]
}

// take returns n zeroed numbers of sc's.
func (sc *Scratch) take(n int) []uint32 { return grow(&sc.nums, n) }

// takeVerdicts returns n zeroed verdicts of sc's.
func (sc *Scratch) takeVerdicts(n int) []Verdict { return grow(&sc.verdicts, n) }

// grow extends *s by n zeroed elements and returns them: no allocation
// once *s has the room (append of a make allocates under -race).
func grow[T any](s *[]T, n int) []T {
	i := len(*s)
	*s = slices.Grow(*s, n)[:i+n]
	clear((*s)[i:])
	return (*s)[i : i+n : i+n]
}

// skey builds "rule\x00limit\x00key" in buf. Limit names are letters,
// digits, - and _, so the side sketches' tags (tagBan, ...) and budgets'
// "$name" never meet a limit's key.
func skey(buf []byte, a, b, key string) []byte {
	buf = append(buf[:0], a...)
	buf = append(buf, 0)
	buf = append(buf, b...)
	return appendKey(buf, key)
}

// skey2 is skey with "$" before b, a budget's name.
func skey2(buf []byte, a, b, key string) []byte {
	buf = append(buf[:0], a...)
	buf = append(buf, 0, '$')
	buf = append(buf, b...)
	return appendKey(buf, key)
}

// MaxKey is the longest key a sketch key holds as it is; a longer one (a
// padded header, a 5,000-byte descriptor value) stands as its SHA-256, so
// that a key costs the same whatever a client sends, and the fleet's hot
// set holds at most this much of each.
const MaxKey = 128

// appendKey appends the separator and key to buf: 0 and the key as it is,
// or 1 and its digest if it is longer than MaxKey (no short key's sketch
// key has a 1 there, so no client can send a digest as its key).
func appendKey(buf []byte, key string) []byte {
	if len(key) <= MaxKey {
		buf = append(buf, 0)
		return append(buf, key...)
	}
	sum := sha256.Sum256([]byte(key))
	buf = append(buf, 1)
	return append(buf, sum[:]...)
}

const (
	tagBan    = "!ban"
	tagNew    = "!new"
	tagKnown  = "!known"
	tagProven = "!proven"
)
