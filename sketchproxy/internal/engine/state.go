package engine

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/epochsketch/epochsketch"
)

// The state file holds every sketch of a Set (limits, budgets, new keys,
// bans): "SKPXSTAT", a version (uint16) and a count (uint32); since version
// 2 the new-key meter's moving average (float64 bits, uint64); since
// version 4 the fleet's membership (FleetMembers: the most replicas seen,
// uint64, 0 for none, and when, Unix ns, int64); then per
// sketch its tick (ns), since version 3 its threshold class (uint32: Class), its bucket
// count and two-choice flag, and its epochsketch snapshot; then
// "SKPXEND!". Versions 1 and 2 (a sketch per tick, counting one unit per
// request for an even burst) are still read: their meter, bans and
// memory of keys are restored, and their limits' and wallets' counts,
// which mean other numbers now, skipped. It holds the sketches' hash keys:
// keep it private.
const (
	stateMagic   = "SKPXSTAT"
	stateEnd     = "SKPXEND!"
	stateVersion = 4
)

// FleetMembers is a Fleet that keeps its membership in the state file:
// the most replicas it saw lately, and when, so that a replica restarted
// while Redis is unreachable assumes as many peers as it last saw, not a
// default (sketchproxy's docs/fleets.md, How a replica counts its peers).
type FleetMembers interface {
	// Members returns the most replicas seen lately and when it was last
	// seen (0 and the zero time: none).
	Members() (n int, at time.Time)
	// RestoreMembers is given what a state file kept.
	RestoreMembers(n int, at time.Time)
}

// sortedKeys returns s's sketches' keys by tick, then size.
func (s *Set) sortedKeys() []sketchKey {
	keys := make([]sketchKey, 0, len(s.sketches))
	for k := range s.sketches {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].tick != keys[j].tick {
			return keys[i].tick < keys[j].tick
		}
		if keys[i].class != keys[j].class {
			return keys[i].class < keys[j].class
		}
		return keys[i].buckets < keys[j].buckets
	})
	return keys
}

// WriteState writes s's sketches and the new-key meter to w in the state
// file's format, and returns how many sketches it wrote.
func (e *Engine) WriteState(w io.Writer, s *Set) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	keys := s.sortedKeys()
	bw := bufio.NewWriterSize(w, 1<<16)
	var h [14]byte
	copy(h[:], stateMagic)
	binary.LittleEndian.PutUint16(h[8:], stateVersion)
	binary.LittleEndian.PutUint32(h[10:], uint32(len(keys)))
	bw.Write(h[:])
	var meter [8]byte
	binary.LittleEndian.PutUint64(meter[:], e.spike.avg.Load())
	bw.Write(meter[:])
	var members [16]byte
	if fm, ok := e.opts.Fleet.(FleetMembers); ok {
		if n, at := fm.Members(); n > 0 {
			binary.LittleEndian.PutUint64(members[:8], uint64(n))
			binary.LittleEndian.PutUint64(members[8:], uint64(at.UnixNano()))
		}
	}
	bw.Write(members[:])
	for _, k := range keys {
		var b [21]byte
		binary.LittleEndian.PutUint64(b[0:], uint64(k.tick))
		binary.LittleEndian.PutUint32(b[8:], k.class)
		binary.LittleEndian.PutUint64(b[12:], uint64(k.buckets))
		if k.two {
			b[20] = 1
		}
		bw.Write(b[:])
		if _, err := s.sketches[k].WriteTo(bw); err != nil {
			return 0, err
		}
	}
	bw.WriteString(stateEnd)
	return len(keys), bw.Flush()
}

// StateSummary is what ReadState restored.
type StateSummary struct {
	Restored, Skipped, Live, Expired int
	Saved                            time.Time
	// Members is the fleet's membership the file kept (FleetMembers), 0
	// for none; MembersAt, when it was seen.
	Members   int
	MembersAt time.Time
}

// ReadState restores a state file's sketches into s's: a sketch in the
// file that s no longer has (another tick or size) is skipped. The new-key
// meter is restored too, so that a restart needs no warm-up. On any error
// every sketch of s is left empty: a bad file never blocks a start.
func (e *Engine) ReadState(r *bufio.Reader, s *Set) (StateSummary, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	sum, meter, err := readState(r, s)
	if err != nil {
		for _, sk := range s.sketches {
			sk.Reset()
		}
		return StateSummary{}, err
	}
	now := e.Now().UnixNano()
	if meter != nil {
		// The new keys' average survives: the clients of before are known
		// keys, not a spike.
		e.spike.avg.Store(*meter)
		e.restoredMeter.Store(true)
		e.lastNew.Store(now) // marks may have been restored
	}
	e.lastBan.Store(now) // bans may have been restored
	if fm, ok := e.opts.Fleet.(FleetMembers); ok && sum.Members > 0 {
		fm.RestoreMembers(sum.Members, sum.MembersAt)
	}
	return sum, nil
}

// ReadMembers reads only the fleet's membership from a state file's
// start (FleetMembers): 0 where the file keeps none (a version before 4,
// or a process that saw no replica).
func ReadMembers(r io.Reader) (n int, at time.Time, err error) {
	var b [14 + 8 + 16]byte
	if _, err = io.ReadFull(r, b[:14]); err != nil {
		return 0, time.Time{}, fmt.Errorf("truncated header")
	}
	if string(b[:8]) != stateMagic {
		return 0, time.Time{}, fmt.Errorf("not a SketchProxy state file")
	}
	if v := binary.LittleEndian.Uint16(b[8:]); v < 4 || v > stateVersion {
		return 0, time.Time{}, nil
	}
	if _, err = io.ReadFull(r, b[14:]); err != nil {
		return 0, time.Time{}, fmt.Errorf("truncated header")
	}
	return membersOf(b[22:])
}

// membersOf decodes the membership's 16 bytes.
func membersOf(b []byte) (n int, at time.Time, err error) {
	m := binary.LittleEndian.Uint64(b[:8])
	if m > 1<<20 {
		return 0, time.Time{}, fmt.Errorf("a fleet of %d replicas: damaged", m)
	}
	if m == 0 {
		return 0, time.Time{}, nil
	}
	return int(m), time.Unix(0, int64(binary.LittleEndian.Uint64(b[8:]))), nil
}

func readState(r *bufio.Reader, s *Set) (sum StateSummary, meter *uint64, err error) {
	var h [14]byte
	if _, err = io.ReadFull(r, h[:]); err != nil {
		return sum, nil, fmt.Errorf("truncated header")
	}
	if string(h[:8]) != stateMagic {
		return sum, nil, fmt.Errorf("not a SketchProxy state file")
	}
	v := binary.LittleEndian.Uint16(h[8:])
	if v < 1 || v > stateVersion {
		return sum, nil, fmt.Errorf("state version %d, this build reads 1 to %d", v, stateVersion)
	}
	if v >= 2 {
		var b [8]byte
		if _, err = io.ReadFull(r, b[:]); err != nil {
			return sum, nil, fmt.Errorf("truncated header")
		}
		avg := binary.LittleEndian.Uint64(b[:])
		meter = &avg
	}
	if v >= 4 {
		var b [16]byte
		if _, err = io.ReadFull(r, b[:]); err != nil {
			return sum, nil, fmt.Errorf("truncated header")
		}
		if sum.Members, sum.MembersAt, err = membersOf(b[:]); err != nil {
			return sum, nil, err
		}
	}
	n := binary.LittleEndian.Uint32(h[10:])
	if n > 1<<16 {
		return sum, nil, fmt.Errorf("%d sketches: damaged", n)
	}
	for range n {
		var b [21]byte
		hdr := b[:21]
		if v < 3 {
			hdr = b[:17] // no threshold
		}
		if _, err = io.ReadFull(r, hdr); err != nil {
			return sum, nil, fmt.Errorf("truncated")
		}
		k := sketchKey{tick: time.Duration(binary.LittleEndian.Uint64(b[0:]))}
		if v < 3 {
			k.buckets, k.two = int(binary.LittleEndian.Uint64(b[8:])), b[16] == 1
		} else {
			k.class, k.buckets, k.two = binary.LittleEndian.Uint32(b[8:]), int(binary.LittleEndian.Uint64(b[12:])), b[20] == 1
		}
		if k.buckets < 1 || k.buckets > 1<<26 {
			return sum, nil, fmt.Errorf("a sketch of %d buckets: damaged", k.buckets)
		}
		// A version 1 or 2 file's sketches are keyed without a class: only
		// the side sketches (class 0: bans, known and new keys, whose
		// counts mean what they did) match; its limits' counts start empty.
		sk, ok := s.sketches[k]
		if !ok {
			if _, err = io.CopyN(io.Discard, r, epochsketch.SnapshotSize(k.buckets)); err != nil {
				return sum, nil, fmt.Errorf("truncated")
			}
			sum.Skipped++
			continue
		}
		info, lerr := sk.LoadFrom(r)
		if lerr != nil {
			return sum, nil, fmt.Errorf("sketch (tick %v, %d buckets): %w", k.tick, k.buckets, lerr)
		}
		sum.Restored++
		sum.Live += info.Live
		sum.Expired += info.Expired
		sum.Saved = info.Saved
	}
	var end [8]byte
	if _, err = io.ReadFull(r, end[:]); err != nil || string(end[:]) != stateEnd {
		return sum, nil, fmt.Errorf("truncated: the end marker is missing")
	}
	return sum, meter, nil
}

// Stats is a sketch's counters (epochsketch.Stats).
type Stats = epochsketch.Stats

// SketchStats calls f for each of s's sketches, by tick, threshold class
// (Class; 0 for the side sketches), then size.
func (s *Set) SketchStats(f func(tick time.Duration, class uint32, buckets int, st Stats)) {
	for _, k := range s.sortedKeys() {
		f(k.tick, k.class&^smoothClass, k.buckets, s.sketches[k].Stats())
	}
}

// Top calls f with ru's top offenders (at most 10) and each one's level in
// the rule's first limit (estimate / threshold, above 0).
func (e *Engine) Top(ru *Rule, f func(key string, level float64)) {
	if len(ru.Limits) == 0 {
		return
	}
	l := ru.Limits[0]
	var buf []byte
	for _, t := range ru.top.List() {
		buf = skey(buf, ru.Name, l.Name, t.Key)
		if est := l.sk.EstimateBytes(buf); est > 0 {
			f(t.Key, float64(est)/float64(nominal(l.Threshold)))
		}
	}
}

// MeterRestored reports whether a state file restored the new-key meter
// (then no warm-up is needed before a spike is called).
func (e *Engine) MeterRestored() bool { return e.restoredMeter.Load() }
