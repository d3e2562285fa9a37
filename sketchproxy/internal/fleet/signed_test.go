package fleet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/testkit"
	"github.com/redis/go-redis/v9"
)

// Signed records on a real redis-server (docs/fleets.md, Signed records):
// replica a reads replica b's record of a key as b signed it; what a
// writer without the fleet's secret puts there (an old replica's unsigned
// record, one signed with another secret, b's record with its count
// lowered, b's own older record written back) is not believed, what a
// knew of b is kept, and the key is decided at the stricter of its share
// and θ/N (suspect). Every replica still writes r:<id> in the form
// replicas before signed records read, so that they see its counts during
// a rolling upgrade.
func TestFleetSignedRecordsOnRedis(t *testing.T) {
	addr := testkit.RedisServer(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	fleetOf := func(id, secret string) *Fleet {
		cfg := *hostileFleet(t, nil, time.Now, 2).cfg
		f := newFleetOn(&cfg, []byte(secret), newRedisStore(&redis.UniversalOptions{Addrs: []string{addr}}), slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
		f.self = id
		t.Cleanup(f.store.close)
		return f
	}
	a, b := fleetOf("a", "0123456789abcdef"), fleetOf("b", "0123456789abcdef")
	const theta = 1000 // the counts far from θ
	entry := func(f *Fleet, c uint32) *hotEntry {
		e := hostileEntry(f, "client", theta, c)
		e.tick = time.Hour // no tick ends during the test: nothing halves
		e.rkey, e.marker = f.redisKeys(e.skey, e.tick, e.theta)
		return e
	}
	ea, eb := entry(a, 10), entry(b, 100)
	round := func(f *Fleet, e *hotEntry) *shareView {
		t.Helper()
		if !f.send([]*hotEntry{e}, false) {
			t.Fatal("the round failed")
		}
		return e.view.Load()
	}
	// b counted 100 (and a 10): a reads b's 100.
	round(a, ea)
	round(b, eb)
	older, err := rdb.HGet(ctx, eb.rkey, "s:b").Result()
	if err != nil {
		t.Fatal(err)
	}
	eb.sk = fixedLocal(120)
	round(b, eb)
	v := round(a, ea)
	if len(v.others) != 1 || v.others[0].id != "b" || v.others[0].c != 120 || v.suspect {
		t.Fatalf("a reads b's record as %+v (suspect %v), want b's count of 120", v.others, v.suspect)
	}
	if old, _ := rdb.HGet(ctx, eb.rkey, "r:b").Result(); !regexp.MustCompile(`^\d+ \d+ \d+ \d+ \d+$`).MatchString(old) {
		t.Errorf("r:b is %q: replicas before signed records cannot read it", old)
	}
	known := v.others[0].c

	for _, c := range []struct {
		name   string
		forge  func()
		reject bool // a's round rejects a record (the metric counts it)
	}{
		{"an old replica's unsigned record", func() {
			now, _ := rdb.Time(ctx).Result()
			rdb.HSet(ctx, ea.rkey, "r:old", fmt.Sprintf("500 500 0 %d %d", now.UnixMicro(), now.Unix()/3600))
		}, true},
		{"a record signed with another secret", func() {
			c := fleetOf("c", "another-secret-of-16-bytes")
			ec := entry(c, 900)
			ec.rkey = eb.rkey // its own secret names the key otherwise
			round(c, ec)
		}, true},
		{"b's record with its count lowered", func() {
			rdb.HSet(ctx, eb.rkey, "s:b", regexp.MustCompile(`^\d+`).ReplaceAllString(older, "2"))
		}, true},
		{"b's older record written back", func() {
			rdb.HSet(ctx, eb.rkey, "s:b", older)
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			round(b, eb) // b writes its record whole again, and the last fault's is gone
			if v := round(a, ea); v.suspect {
				t.Fatalf("a's view is suspect before the fault: %+v", v.others)
			}
			rejected := a.rejected.Load()
			c.forge()
			v := round(a, ea)
			var cb uint32
			for _, p := range v.others {
				switch p.id {
				case "b":
					cb = p.c
				default:
					t.Errorf("a believes a record of %q: %+v", p.id, p)
				}
			}
			if cb < known {
				t.Errorf("b's count reads %d after the fault, want at least the %d a knew", cb, known)
			}
			if !v.suspect {
				t.Error("a's view is not suspect: the key is not held at θ/N while what b counted is unknown")
			}
			if got := a.rejected.Load() > rejected; got != c.reject {
				t.Errorf("rejected counted: %v, want %v", got, c.reject)
			}
			rdb.HDel(ctx, ea.rkey, "r:old", "r:c", "s:c")
		})
	}
}

// BenchmarkFleetRecordMAC is what signing or verifying one record costs
// the sync goroutine (once per hot key a send, once per other replica's
// record a reply or claim).
func BenchmarkFleetRecordMAC(b *testing.B) {
	f := hostileFleet(b, nil, time.Now, 2)
	e := hostileEntry(f, "client", 40, 10)
	r := signedRec{id: "proxy-a.0123abcd", c: 12, d: 30, g: 10, at: 56_666_666, ts: time.Now().UnixMicro()}
	r.mac = f.macOf(e.rkey, &r)
	b.ReportAllocs()
	for b.Loop() {
		if !f.verify(e.rkey, &r) {
			b.Fatal("does not verify")
		}
	}
}
