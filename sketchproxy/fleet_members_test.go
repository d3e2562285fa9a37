package sketchproxy

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/testkit"
	"github.com/redis/go-redis/v9"
)

// A writer without the secret deletes the members (the signed hash and
// the sorted set) as fast as it can: each replica's heartbeat then reads
// its own entry alone, and once the most seen lately had passed every
// replica counted itself alone, min_replicas 3 set or not (a review's
// test: N = 1 after 3 to 11 s, then 31 of a burst of 20). min_replicas is
// N's floor whether Redis answers or not.
func TestFleetMembersDeletedMinReplicas(t *testing.T) {
	l := procLimit{requests: 20, per: time.Minute, burst: 20}
	addr := testkit.RedisServer(t)
	ls := procReplicas(t, 3, l, FleetConfig{Redis: addr, MinReplicas: 3})
	waitMembers(t, ls, 3)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx := context.Background()
	var deletes int
	stop := everyMillisecond(func() {
		if n, err := rdb.Del(ctx, hostilePrefix+"{"+hostilePrefix+"members}:signed", hostilePrefix+"members").Result(); err == nil && n > 0 {
			deletes++
		}
	})
	time.Sleep(8 * time.Second) // past the most seen lately (two windows)
	for i, r := range ls {
		if n := r.mw.fleet.Stats().Replicas; n != 3 {
			t.Errorf("after 8 s of the members deleted, replica %d counts %d replicas, want min_replicas 3", i, n)
		}
	}
	procTick(t, l, 500*time.Millisecond)
	var heavy, light procRun
	sendBurst(ls, &heavy, &light, "heavy", "light")
	stop()
	if deletes == 0 {
		t.Fatal("nothing was deleted: the case measures nothing")
	}
	t.Logf("members deleted %d times", deletes)
	skipIfLate(t, ls)
	heavy.check(t, l, light, 0)
}

// The members' keys made of another type (SET) before the replicas
// start: the heartbeat's script fails with WRONGTYPE on every round.
// Such a round was taken as good and the heartbeat's count as missing,
// and the hot keys' records were skipped too: N stayed 2 for 3
// replicas, and Redis then paused, they admitted 30 of a burst of 20 (a
// review's test). The records' replicas count now (and it is warned).
func TestFleetMembersWrongType(t *testing.T) {
	for _, key := range []string{hostilePrefix + "members", hostilePrefix + "{" + hostilePrefix + "members}:signed"} {
		t.Run(key, func(t *testing.T) {
			l := procLimit{requests: 20, per: time.Minute, burst: 20}
			addr, proc := testkit.RedisProcess(t)
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			defer rdb.Close()
			if err := rdb.Set(context.Background(), key, "x", 0).Err(); err != nil {
				t.Fatal(err)
			}
			ls := procReplicas(t, 3, l, FleetConfig{Redis: addr})
			for i := range 60 { // a key hot on every replica: its records name 3
				ls[i%3].Allow("warm")
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(time.Second)
			for i, r := range ls {
				if n := r.mw.fleet.Stats().Replicas; n != 3 {
					t.Errorf("replica %d counts %d replicas, want the 3 a hot key's records name", i, n)
				}
			}
			proc.Signal(syscall.SIGSTOP)
			defer proc.Signal(syscall.SIGCONT)
			time.Sleep(time.Second) // every replica's rounds time out
			procTick(t, l, 500*time.Millisecond)
			var out, light procRun
			for i := range 90 {
				out.send(ls[i%3], fmt.Sprint("outage-", key))
			}
			out.check(t, l, light, 0)
		})
	}
}

// A replica restarted under a new name (no state file) was counted twice
// until its predecessor's heartbeat left the window, and N kept that
// count for two periods more: room held at a fresh key's birth for a
// replica that does not exist refused a client under its limit (16 to 17
// of 19 requests of a burst of 20 in 4 of 5 keys, a review's test). A
// replica that closes leaves the members, and a key's birth holds room
// only for the replicas the last heartbeat counted.
func TestFleetRestartClientUnderLimit(t *testing.T) {
	l := procLimit{requests: 20, per: time.Minute, burst: 20}
	addr := testkit.RedisServer(t)
	fc := FleetConfig{Redis: addr}
	ls := procReplicas(t, 3, l, fc)
	waitMembers(t, ls, 3)
	for k := range 4 {
		procTick(t, l, 2*time.Second)
		if k%2 == 1 {
			ls[2].Close()
			c := fc
			c.ID = fmt.Sprint("r2-", k)
			ls[2] = procReplica(t, l, c, "")
		}
		key := fmt.Sprint("under-", k)
		got := 0
		for i := range 19 {
			if ls[i%3].Allow(key) {
				got++
			}
			time.Sleep(3 * time.Millisecond)
		}
		var ns []int64
		for _, r := range ls {
			ns = append(ns, r.mw.fleet.Stats().Replicas)
		}
		t.Logf("key %d (a replica restarted just before: %v): a client under its limit got %d of 19; N %v", k, k%2 == 1, got, ns)
		if got != 19 {
			t.Errorf("key %d: %d of 19 requests of a client under its limit refused", k, 19-got)
		}
		time.Sleep(time.Second)
	}
}
