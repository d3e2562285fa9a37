package sketchproxy

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/redis/go-redis/v9"
)

// FleetConfig makes N SketchProxy replicas enforce one limit through Redis
// (or Valkey), sharing only the elephants. See the README's "Fleets".
type FleetConfig struct {
	// Redis is host:port (required).
	Redis    string `yaml:"redis"`
	Password string `yaml:"password"` // or the environment variable named by PasswordEnv
	// PasswordEnv names an environment variable holding the password.
	PasswordEnv string `yaml:"password_env"`
	DB          int    `yaml:"db"`
	// Secret keys the HMAC that hashes every key before it leaves the
	// process: Redis never sees a client address or an API key. At least 16
	// bytes, the same on every replica; or SecretFile.
	Secret     string `yaml:"secret"`
	SecretFile string `yaml:"secret_file"`
	// Replicas is N; 0 counts the replicas that heartbeat to Redis.
	Replicas int `yaml:"replicas"`
	// ID names this replica in the heartbeat (default host-pid).
	ID string `yaml:"id"`
	// Interval between sync rounds (default 500ms); Timeout bounds a round
	// (default 250ms).
	Interval Duration `yaml:"interval"`
	Timeout  Duration `yaml:"timeout"`
	// PromoteFraction: a key whose local estimate passes this fraction of
	// θ/N joins the hot set (default 0.5); it leaves below a quarter of that.
	PromoteFraction float64 `yaml:"promote_fraction"`
	// MaxHot bounds the hot set (default 10000).
	MaxHot int `yaml:"max_hot"`
	// Prefix of the Redis keys (default "sketchproxy:").
	Prefix string `yaml:"prefix"`
	// WalletOnFailure: "closed" (default) refuses budget routes with 503
	// while Redis is unreachable; "local" enforces θ/N locally instead.
	WalletOnFailure string `yaml:"wallet_on_failure"`

	secret []byte
}

func (c *Config) validateFleet() error {
	f := c.Fleet
	if f == nil {
		return nil
	}
	if f.Redis == "" {
		return c.errAt("redis: missing: say where Redis is, e.g. redis: 127.0.0.1:6379", "fleet")
	}
	if f.PasswordEnv != "" && f.Password == "" {
		f.Password = os.Getenv(f.PasswordEnv)
	}
	switch {
	case f.Secret != "" && f.SecretFile != "":
		return c.errAt("give secret or secret_file, not both", "fleet")
	case f.SecretFile != "":
		b, err := os.ReadFile(f.SecretFile)
		if err != nil {
			return c.errAt(err.Error(), "fleet", "secret_file")
		}
		f.secret = []byte(strings.TrimSpace(string(b)))
	default:
		f.secret = []byte(f.Secret)
	}
	if len(f.secret) < 16 {
		return c.errAt("a per-deployment secret of at least 16 bytes is required (secret or secret_file): keys are hashed with it before they reach Redis", "fleet", "secret")
	}
	if f.Replicas < 0 || f.Replicas > 1000 {
		return c.errAt(fmt.Sprintf("%d: want 0 (count heartbeats) to 1000", f.Replicas), "fleet", "replicas")
	}
	if f.ID == "" {
		h, _ := os.Hostname()
		f.ID = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	if f.Interval == 0 {
		f.Interval = Duration(500 * time.Millisecond)
	}
	if f.Timeout == 0 {
		f.Timeout = Duration(250 * time.Millisecond)
	}
	if f.Interval < Duration(10*time.Millisecond) || f.Interval > Duration(time.Minute) {
		return c.errAt("want 10ms to 1m", "fleet", "interval")
	}
	if f.Timeout <= 0 || f.Timeout > f.Interval*4 {
		return c.errAt("want more than 0 and at most 4 intervals", "fleet", "timeout")
	}
	if f.PromoteFraction == 0 {
		f.PromoteFraction = 0.5
	}
	if f.PromoteFraction <= 0 || f.PromoteFraction > 1 {
		return c.errAt(fmt.Sprintf("%g: want more than 0 and at most 1", f.PromoteFraction), "fleet", "promote_fraction")
	}
	if f.MaxHot == 0 {
		f.MaxHot = 10000
	}
	if f.MaxHot < 1 || f.MaxHot > 1<<20 {
		return c.errAt("want 1 to 2^20", "fleet", "max_hot")
	}
	if f.Prefix == "" {
		f.Prefix = "sketchproxy:"
	}
	switch f.WalletOnFailure {
	case "":
		f.WalletOnFailure = "closed"
	case "closed", "local":
	default:
		return c.errAt(fmt.Sprintf("%q: want closed or local", f.WalletOnFailure), "fleet", "wallet_on_failure")
	}
	return nil
}

// syncScript applies the sketch's halving to a key's fleet count with
// Redis's own clock (no skew between replicas), adds a replica's delta, sets
// a TTL of a few half-lives, and returns the count and its tick.
//
// KEYS[1] the hashed key; ARGV: tick in ms, delta, TTL in ms.
const syncScript = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tick = math.floor(now / tonumber(ARGV[1]))
local v = redis.call('HMGET', KEYS[1], 'c', 't')
local c = tonumber(v[1]) or 0
local last = tonumber(v[2]) or tick
local age = tick - last
if age >= 53 then c = 0 elseif age > 0 then c = math.floor(c / 2 ^ age) end
c = c + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'c', c, 't', tick)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {c, tick}
`

// fleet is the shared state of one Middleware's replica.
type fleet struct {
	cfg    *FleetConfig
	rdb    *redis.Client
	script *redis.Script
	log    *slog.Logger
	now    func() time.Time

	n  atomic.Int64 // replicas, at least 1
	up atomic.Bool

	shards [16]hotShard
	count  atomic.Int64

	rounds, roundErrors, keySyncs, commands atomic.Uint64
	promotions, demotions, hotFull          atomic.Uint64
	rttNs, lastOK                           atomic.Int64

	run   string // the Redis run marker last seen (sync goroutine only)
	runID string // this replica\'s candidate marker

	stop chan struct{}
	done chan struct{}
}

type hotShard struct {
	mu sync.Mutex
	m  map[string]*hotEntry
}

// hotEntry is one promoted key of one limit or budget.
type hotEntry struct {
	rkey    string // prefix + HMAC(secret, sketch key)
	skey    []byte // the local sketch key
	sk      *epochsketch.Sketch
	tick    time.Duration
	theta   uint32
	delta   atomic.Int64 // local units not yet sent
	sent    int64        // units sent in the last good round (sync goroutine only)
	reseed  atomic.Bool  // Redis lost its state: send the local history again
	val     atomic.Int64 // the fleet count at valTick
	valTick atomic.Int64
	synced  atomic.Bool
}

func newFleet(cfg *FleetConfig, log *slog.Logger, now func() time.Time) *fleet {
	f := &fleet{
		cfg: cfg, log: log, now: now,
		rdb: redis.NewClient(&redis.Options{
			Addr: cfg.Redis, Password: cfg.Password, DB: cfg.DB,
			DialTimeout: time.Duration(cfg.Timeout), ReadTimeout: time.Duration(cfg.Timeout),
			WriteTimeout: time.Duration(cfg.Timeout), MaxRetries: -1, PoolSize: 4,
		}),
		script: redis.NewScript(syncScript),
		runID:  cfg.ID,
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	for i := range f.shards {
		f.shards[i].m = map[string]*hotEntry{}
	}
	f.n.Store(int64(max(1, cfg.Replicas)))
	go f.loop()
	return f
}

func (f *fleet) close() {
	close(f.stop)
	<-f.done
	f.rdb.Close()
}

func (f *fleet) shard(k []byte) *hotShard {
	var h uint32 = 2166136261
	for _, c := range k {
		h = (h ^ uint32(c)) * 16777619
	}
	return &f.shards[h%uint32(len(f.shards))]
}

func (f *fleet) replicas() uint32 { return uint32(max(1, f.n.Load())) }

// promoteAt is the local estimate at which a key joins the hot set.
func (f *fleet) promoteAt(theta uint32) uint32 {
	return max(1, uint32(f.cfg.PromoteFraction*float64(theta)/float64(f.replicas())))
}

// estimate is the fleet-wide estimate for a limit whose local estimate is
// local (after adding w units of this request), adding w to the key's
// unsynced delta if it is hot. While Redis is down it is local × N: the
// limit is enforced at θ/N per replica. Mice (below a quarter of the
// promotion point) cost one comparison: no map, no Redis.
func (f *fleet) estimate(skey []byte, sk *epochsketch.Sketch, tick time.Duration, theta, local, w uint32, now time.Time) uint32 {
	p := f.promoteAt(theta)
	if !f.up.Load() {
		// Local at θ/N; a hot key's units still count toward its delta, to
		// be sent when Redis answers again.
		if local >= max(1, p/4) {
			f.add(skey, w)
		}
		return uint32(min(uint64(local)*uint64(f.replicas()), math.MaxUint32))
	}
	if local < max(1, p/4) {
		return local
	}
	s := f.shard(skey)
	s.mu.Lock()
	e := s.m[string(skey)]
	if e == nil {
		if local < p {
			s.mu.Unlock()
			return local
		}
		if f.count.Load() >= int64(f.cfg.MaxHot) {
			s.mu.Unlock()
			f.hotFull.Add(1)
			return local
		}
		e = &hotEntry{rkey: f.redisKey(skey), skey: append([]byte(nil), skey...), sk: sk, tick: tick, theta: theta}
		e.delta.Store(int64(local)) // the history this replica saw
		s.m[string(e.skey)] = e
		f.count.Add(1)
		f.promotions.Add(1)
		s.mu.Unlock()
		return local
	}
	s.mu.Unlock()
	d := e.delta.Add(int64(w))
	if !e.synced.Load() {
		return local
	}
	age := now.UnixNano()/int64(tick) - e.valTick.Load()
	v := e.val.Load()
	if age >= 63 {
		v = 0
	} else if age > 0 {
		v >>= age
	}
	est := max(uint64(v+d), uint64(local))
	if e.reseed.Load() {
		// Redis restarted empty and the replicas' histories are on their
		// way: until then the fleet count is low; the local view × N is not.
		est = max(est, uint64(local)*uint64(f.replicas()))
	}
	return uint32(min(est, math.MaxUint32))
}

// add charges w more units to a hot key (a wallet's reconciliation).
func (f *fleet) add(skey []byte, w uint32) {
	s := f.shard(skey)
	s.mu.Lock()
	e := s.m[string(skey)]
	s.mu.Unlock()
	if e != nil {
		e.delta.Add(int64(w))
	}
}

func (f *fleet) redisKey(skey []byte) string {
	m := hmac.New(sha256.New, f.cfg.secret)
	m.Write(skey)
	return f.cfg.Prefix + "k:" + hex.EncodeToString(m.Sum(nil)[:16])
}

// loop syncs every interval; after a failure it waits longer, up to 1 s or
// two intervals, before the next try, and recovers at the first round that
// succeeds. The cap is short because replicas that recover at different
// times see each other's counts late.
func (f *fleet) loop() {
	defer close(f.done)
	wait := time.Duration(f.cfg.Interval)
	f.round() // at once: learn N and whether Redis answers
	for {
		select {
		case <-f.stop:
			return
		case <-time.After(wait):
		}
		if f.round() {
			wait = time.Duration(f.cfg.Interval)
		} else {
			wait = min(2*wait, max(time.Second, 2*time.Duration(f.cfg.Interval)))
		}
	}
}

func (f *fleet) round() bool {
	var es []*hotEntry
	for i := range f.shards {
		s := &f.shards[i]
		s.mu.Lock()
		for _, e := range s.m {
			es = append(es, e)
		}
		s.mu.Unlock()
	}
	ds := make([]int64, len(es))
	for i, e := range es {
		ds[i] = e.delta.Swap(0)
		if e.reseed.Load() {
			// Redis restarted empty: every replica sends its whole local
			// history once, less what it already sent since the restart.
			ds[i] += max(0, int64(e.sk.EstimateBytes(e.skey))-ds[i]-e.sent)
		}
	}
	ok := f.send(es, ds)
	if !ok {
		for i, e := range es {
			e.delta.Add(ds[i]) // sent at the next good round
		}
	}
	return ok
}

func (f *fleet) send(es []*hotEntry, ds []int64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(f.cfg.Timeout))
	defer cancel()
	start := time.Now()
	var runCmd *redis.StringCmd
	exec := func() ([]*redis.Cmd, *redis.IntCmd, error) {
		pipe := f.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(es))
		for i, e := range es {
			ttl := max(4*e.tick, 2*time.Duration(f.cfg.Interval))
			cmds[i] = f.script.EvalSha(ctx, pipe, []string{e.rkey}, e.tick.Milliseconds(), ds[i], ttl.Milliseconds())
		}
		// A marker only the first replica after a Redis restart can set:
		// when it changes, Redis lost the fleet's counts.
		pipe.SetNX(ctx, f.cfg.Prefix+"run", fmt.Sprintf("%s-%d", f.runID, time.Now().UnixNano()), 0)
		run := pipe.Get(ctx, f.cfg.Prefix+"run")
		runCmd = run
		var card *redis.IntCmd
		if f.cfg.Replicas == 0 {
			nowMs := float64(f.now().UnixMilli())
			members := f.cfg.Prefix + "members"
			pipe.ZAdd(ctx, members, redis.Z{Score: nowMs, Member: f.cfg.ID})
			pipe.ZRemRangeByScore(ctx, members, "-inf", strconv.FormatFloat(nowMs-3*float64(time.Duration(f.cfg.Interval).Milliseconds())-1000, 'f', 0, 64))
			card = pipe.ZCard(ctx, members)
			pipe.PExpire(ctx, members, time.Minute)
		}
		f.commands.Add(uint64(pipe.Len()))
		_, err := pipe.Exec(ctx)
		return cmds, card, err
	}
	cmds, card, err := exec()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		if lerr := f.script.Load(ctx, f.rdb).Err(); lerr == nil {
			f.commands.Add(1)
			cmds, card, err = exec()
		}
	}
	f.rounds.Add(1)
	if err != nil {
		f.roundErrors.Add(1)
		if f.up.Swap(false) || f.lastOK.Load() == 0 {
			f.log.Warn("fleet: Redis unreachable: enforcing limits locally at 1/N", "err", err.Error(), "replicas", f.replicas())
		}
		return false
	}
	f.rttNs.Store(int64(time.Since(start)))
	f.lastOK.Store(f.now().UnixNano())
	f.keySyncs.Add(uint64(len(es)))
	if card != nil {
		f.n.Store(max(1, card.Val()))
	}
	lost := false
	if r := runCmd.Val(); r != f.run {
		lost = f.run != "" // the first round only learns the marker
		f.run = r
		if lost {
			f.log.Warn("fleet: Redis lost the shared counts (restarted empty): resending local histories")
		}
	}
	for i, e := range es {
		e.sent = ds[i]
		e.reseed.Store(lost)
		res, err := cmds[i].Int64Slice()
		if err != nil || len(res) != 2 {
			continue
		}
		e.valTick.Store(res[1])
		e.val.Store(res[0])
		e.synced.Store(true)
	}
	if !f.up.Swap(true) {
		f.log.Info("fleet: Redis reachable: enforcing fleet-wide limits", "replicas", f.replicas(), "hot_keys", f.count.Load())
	}
	f.demote(es)
	return true
}

// demote drops hot keys that fell well below the promotion point, here and
// fleet-wide.
func (f *fleet) demote(es []*hotEntry) {
	for _, e := range es {
		p := f.promoteAt(e.theta)
		local := e.sk.EstimateBytes(e.skey)
		if local >= max(1, p/4) || e.val.Load() >= int64(p) || e.delta.Load() != 0 || e.reseed.Load() {
			continue
		}
		s := f.shard(e.skey)
		s.mu.Lock()
		if s.m[string(e.skey)] == e {
			delete(s.m, string(e.skey))
			f.count.Add(-1)
			f.demotions.Add(1)
		}
		s.mu.Unlock()
	}
}
