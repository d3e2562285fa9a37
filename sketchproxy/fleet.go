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

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// FleetConfig makes N SketchProxy replicas enforce one limit through Redis
// (or Valkey), sharing only the elephants. See the README's "Fleets".
type FleetConfig struct {
	// Redis is one server: host:port, or a redis:// or rediss:// (TLS) URL
	// with an optional user, password and database, e.g.
	// rediss://sketchproxy@redis.internal:6380/2. Give Redis, Cluster or
	// Sentinel.
	Redis string `yaml:"redis" example:"\"rediss://sketchproxy@redis.internal:6380/0\""`
	// Cluster lists seed nodes (host:port) of a Redis Cluster.
	Cluster []string `yaml:"cluster" example:"[10.0.0.11:6379, 10.0.0.12:6379]"`
	// Sentinel finds the master through Redis Sentinel.
	Sentinel *SentinelConfig `yaml:"sentinel"`
	// Username is the ACL user (Redis 6 and later; default: the URL's, or
	// "default").
	Username string `yaml:"username" example:"sketchproxy"`
	// The password: from a file (PasswordFile, e.g. a mounted secret), an
	// environment variable (PasswordEnv), the URL, or Password in this
	// file; give at most one.
	Password     string `yaml:"password" example:"s3cret"`
	PasswordEnv  string `yaml:"password_env" example:"REDIS_PASSWORD"`
	PasswordFile string `yaml:"password_file" example:"/run/secrets/redis-password"`
	// DB is the database number (default: the URL's, or 0).
	DB int `yaml:"db" example:"2"`
	// TLS: a CA to verify the server with, a client certificate, and the
	// name to verify (default: the host). A rediss:// URL turns TLS on with
	// the system's CAs.
	TLS *FleetTLS `yaml:"tls"`
	// Secret keys the HMAC that hashes every key before it leaves the
	// process: Redis never sees a client address or an API key. At least 16
	// bytes, the same on every replica; or SecretFile.
	Secret     string `yaml:"secret" example:"\"a-per-deployment-secret-of-16-bytes-or-more\""`
	SecretFile string `yaml:"secret_file" example:"/etc/sketchproxy/fleet-secret"`
	// Replicas is N; 0 counts the replicas that heartbeat to Redis.
	Replicas int `yaml:"replicas" example:"3"`
	// ID names this replica in the heartbeat (default host-pid).
	ID string `yaml:"id" example:"proxy-a"`
	// Interval between sync rounds (default 500ms); Timeout bounds a round
	// (default 250ms).
	Interval Duration `yaml:"interval" example:"500ms"`
	Timeout  Duration `yaml:"timeout" example:"250ms"`
	// PromoteFraction: a key whose local estimate passes this fraction of
	// θ/N joins the hot set (default 0.5); it leaves below a quarter of that.
	PromoteFraction float64 `yaml:"promote_fraction" example:"0.5"`
	// MaxHot bounds the hot set (default 10000).
	MaxHot int `yaml:"max_hot" example:"10000"`
	// Prefix of the Redis keys (default "sketchproxy:").
	Prefix string `yaml:"prefix" example:"\"sketchproxy:\""`
	// WalletOnFailure: "closed" (default) refuses budget routes with 503
	// while Redis is unreachable; "local" enforces θ/N locally instead.
	WalletOnFailure string `yaml:"wallet_on_failure" example:"local"`
}

// fleetBuilt is what validating a fleet section reads and builds.
type fleetBuilt struct {
	secret []byte
	opts   *redis.UniversalOptions
}

// SentinelConfig is a Redis Sentinel deployment: the master's name and the
// sentinels' addresses.
type SentinelConfig struct {
	// Master is the name the sentinels know the master by.
	Master string `yaml:"master" example:"mymaster"`
	// Addrs are the sentinels' addresses (host:port).
	Addrs []string `yaml:"addrs" example:"[10.0.0.21:26379, 10.0.0.22:26379]"`
	// Password of the sentinels themselves, if they require one (or
	// PasswordEnv).
	Password    string `yaml:"password" example:"s3cret"`
	PasswordEnv string `yaml:"password_env" example:"SENTINEL_PASSWORD"`
}

// FleetTLS is the TLS of the connection to Redis.
type FleetTLS struct {
	// CAFile holds the CAs that verify Redis's certificate (PEM; default:
	// the system's).
	CAFile string `yaml:"ca_file" example:"/etc/sketchproxy/redis-ca.pem"`
	// CertFile and KeyFile are this replica's client certificate and its
	// key (PEM), for Redis servers that ask for one.
	CertFile string `yaml:"cert_file" example:"/etc/sketchproxy/client.pem"`
	KeyFile  string `yaml:"key_file" example:"/etc/sketchproxy/client.key"`
	// ServerName is the name Redis's certificate must carry (default: the
	// host).
	ServerName string `yaml:"server_name" example:"redis.internal"`
}

func (c *Config) validateFleet(fb *fleetBuilt) error {
	f := c.Fleet
	if f == nil {
		return nil
	}
	switch {
	case f.Secret != "" && f.SecretFile != "":
		return c.errAt("give secret or secret_file, not both", "fleet")
	case f.SecretFile != "":
		b, err := os.ReadFile(f.SecretFile)
		if err != nil {
			return c.errAt(err.Error(), "fleet", "secret_file")
		}
		fb.secret = []byte(strings.TrimSpace(string(b)))
	default:
		fb.secret = []byte(f.Secret)
	}
	if len(fb.secret) < 16 {
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
	if strings.ContainsAny(f.Prefix, "{}") {
		return c.errAt(fmt.Sprintf("%q: no { or }: the keys' hash tags follow the prefix", f.Prefix), "fleet", "prefix")
	}
	switch f.WalletOnFailure {
	case "":
		f.WalletOnFailure = "closed"
	case "closed", "local":
	default:
		return c.errAt(fmt.Sprintf("%q: want closed or local", f.WalletOnFailure), "fleet", "wallet_on_failure")
	}
	return c.fleetOptions(fb)
}

// syncScript applies the sketch's halving to a key's fleet count with
// Redis's own clock (no skew between replicas), adds a replica's delta, sets
// a TTL of a few half-lives, and returns the count and its tick.
//
// It also keeps the run marker of the key's hash tag (KEYS[2], in the same
// slot): set only if absent, so only the first replica after a restart sets
// it, and returned, so a changed marker tells that Redis lost the tag's
// counts. No command beyond one per hot key.
//
// KEYS[1] the hashed key, KEYS[2] its tag's marker; ARGV: tick in ms,
// delta, TTL in ms, this replica's candidate marker.
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
redis.call('SET', KEYS[2], ARGV[4], 'NX')
return {c, tick, redis.call('GET', KEYS[2])}
`

// fleet is the shared state of one Middleware's replica.
type fleet struct {
	cfg    *FleetConfig
	secret []byte // keys are HMACed with it before they reach Redis
	rdb    redis.UniversalClient
	script *redis.Script
	log    *slog.Logger
	now    func() time.Time

	n  atomic.Int64 // replicas, at least 1
	up atomic.Bool

	shards [16]hotShard
	count  atomic.Int64

	rounds, roundErrors, keySyncs, commands atomic.Uint64
	promotions, demotions, hotFull, resends atomic.Uint64
	rttNs, lastOK                           atomic.Int64
	roundTime                               prometheus.Histogram

	run   map[string]string // each hash tag's run marker as last seen, by marker key (sync goroutine only)
	runID string            // this replica\'s candidate marker

	stop chan struct{}
	done chan struct{}
}

type hotShard struct {
	mu sync.Mutex
	m  map[string]*hotEntry
}

// hotEntry is one promoted key of one limit or budget.
type hotEntry struct {
	rkey   string // prefix + {tag} + HMAC(secret, sketch key)
	marker string // prefix + {tag} + run: the tag's run marker, in the same slot
	skey   []byte // the local sketch key
	sk     engine.Local
	tick   time.Duration
	theta  uint32
	// base is the part of the local estimate Redis holds, at the tick it
	// was taken (packBase): what a round sends is the local estimate now
	// less base decayed to now, so units counted while Redis was away are
	// sent halved as the sketch halved them, never as they were.
	base    atomic.Uint64
	reseed  atomic.Bool  // Redis lost its state: the other replicas' histories are on their way
	val     atomic.Int64 // the fleet count at valTick
	valTick atomic.Int64
	synced  atomic.Bool
}

func newFleet(cfg *FleetConfig, fb *fleetBuilt, log *slog.Logger, now func() time.Time) *fleet {
	f := &fleet{
		cfg: cfg, log: log, now: now,
		rdb:    redis.NewUniversalClient(fb.opts),
		secret: fb.secret,
		script: redis.NewScript(syncScript),
		runID:  cfg.ID,
		run:    map[string]string{},
		roundTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sketchproxy_fleet_round_duration_seconds",
			Help:    "Time of each sync round with Redis (one pipeline per node), failed rounds included.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14), // 0.1 ms to 0.8 s
		}),
		stop: make(chan struct{}),
		done: make(chan struct{}),
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

// Estimate is the fleet-wide estimate for a limit whose local estimate is
// local (engine.Fleet): for a hot key, the fleet count decayed to now plus
// what the local sketch counted since the last round. While Redis is down
// it is local × N: the limit is enforced at θ/N per replica. Mice (below a
// quarter of the promotion point) cost one comparison: no map, no Redis.
func (f *fleet) Estimate(skey []byte, sk engine.Local, tick time.Duration, theta, local uint32, now time.Time) uint32 {
	return f.fleetwide(skey, sk, tick, theta, local, now)
}

// WalletsClosed reports whether wallets fail closed now: Redis is down and
// wallet_on_failure is closed. A refused client retries after a round.
func (f *fleet) WalletsClosed() (bool, time.Duration) {
	return !f.up.Load() && f.cfg.WalletOnFailure == "closed", time.Duration(f.cfg.Interval)
}

// fleetwide is Estimate.
func (f *fleet) fleetwide(skey []byte, sk engine.Local, tick time.Duration, theta, local uint32, now time.Time) uint32 {
	p := f.promoteAt(theta)
	if !f.up.Load() {
		// Local at θ/N. A hot key's units are in the local sketch, sent
		// (decayed) when Redis answers again.
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
		// base 0: the first round sends the history this replica saw.
		e = &hotEntry{skey: append([]byte(nil), skey...), sk: sk, tick: tick, theta: theta}
		e.rkey, e.marker = f.redisKeys(skey)
		s.m[string(e.skey)] = e
		f.count.Add(1)
		f.promotions.Add(1)
		s.mu.Unlock()
		return local
	}
	s.mu.Unlock()
	if !e.synced.Load() {
		return local
	}
	tk := now.UnixNano() / int64(tick)
	d := max(0, int64(local)-int64(e.baseAt(tk))) // counted here, not yet in Redis
	age := tk - e.valTick.Load()
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

// Packing of hotEntry.base: the tick (mod 2^40) above a 24-bit estimate.
const (
	baseBits  = 24
	baseTicks = 1<<40 - 1
)

func packBase(est uint32, tick int64) uint64 {
	return uint64(tick)&baseTicks<<baseBits | uint64(min(est, 1<<baseBits-1))
}

// baseAt is base decayed to tick tk, as the local sketch decays.
func (e *hotEntry) baseAt(tk int64) uint32 {
	b := e.base.Load()
	age := (uint64(tk) - b>>baseBits) & baseTicks
	return uint32(b&(1<<baseBits-1)) >> min(age, 31)
}

// fleetTags is how many hash tags spread the hot keys over a Redis
// Cluster's nodes; each tag's keys and run marker share a slot.
const fleetTags = 16

// redisKeys are the key's name in Redis, the keyed hash of the sketch key
// (Redis never sees a client address or an API key), and the run marker of
// its hash tag.
func (f *fleet) redisKeys(skey []byte) (key, marker string) {
	m := hmac.New(sha256.New, f.secret)
	m.Write(skey)
	sum := m.Sum(nil)
	tag := f.cfg.Prefix + "{t" + strconv.Itoa(int(sum[16])%fleetTags) + "}"
	return tag + "k:" + hex.EncodeToString(sum[:16]), tag + "run"
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
	// What Redis lacks of each key: the local estimate now less what it
	// holds of it, both decayed to now. A round that fails changes
	// nothing, so the next good one sends everything since the last.
	now := f.now()
	ds := make([]int64, len(es))
	locals := make([]uint32, len(es))
	for i, e := range es {
		locals[i] = e.sk.EstimateBytes(e.skey)
		ds[i] = max(0, int64(locals[i])-int64(e.baseAt(now.UnixNano()/int64(e.tick))))
	}
	return f.send(es, ds, locals, now)
}

func (f *fleet) send(es []*hotEntry, ds []int64, locals []uint32, now time.Time) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(f.cfg.Timeout))
	defer cancel()
	start := time.Now()
	candidate := fmt.Sprintf("%s-%d", f.runID, time.Now().UnixNano())
	exec := func() ([]*redis.Cmd, *redis.IntCmd, error) {
		pipe := f.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(es))
		for i, e := range es {
			ttl := max(4*e.tick, 2*time.Duration(f.cfg.Interval))
			cmds[i] = f.script.EvalSha(ctx, pipe, []string{e.rkey, e.marker}, e.tick.Milliseconds(), ds[i], ttl.Milliseconds(), candidate)
		}
		if len(es) == 0 {
			pipe.Ping(ctx) // no hot keys: still learn whether Redis answers
		}
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
		// A restarted or promoted node has no scripts: load on every node.
		if lerr := f.script.Load(ctx, f.rdb).Err(); lerr == nil {
			f.commands.Add(1)
			cmds, card, err = exec()
		}
	}
	f.rounds.Add(1)
	f.roundTime.Observe(time.Since(start).Seconds())
	// Keys whose node answered are synced even when another node did not
	// (Redis Cluster): what they sent is not sent again. A tag whose marker
	// changed lost its counts (with Redis Cluster, one node can).
	type result struct {
		c, tick int64
		ok      bool
	}
	res := make([]result, len(es))
	lostTags := map[string]bool{}
	for i, e := range es {
		v, cerr := cmds[i].Slice()
		if cerr != nil || len(v) != 3 {
			continue
		}
		c, ok1 := v[0].(int64)
		tk, ok2 := v[1].(int64)
		run, ok3 := v[2].(string)
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		res[i] = result{c, tk, true}
		if old, seen := f.run[e.marker]; seen && old != run {
			lostTags[e.marker] = true
		}
		f.run[e.marker] = run
	}
	if len(lostTags) > 0 {
		f.resends.Add(1)
		f.log.Warn("fleet: Redis lost the shared counts (restarted empty): resending local histories, decayed", "hash_tags", len(lostTags))
	}
	synced := 0
	for i, e := range es {
		if !res[i].ok {
			continue
		}
		synced++
		// Redis now holds this replica's estimate, or, if the node had
		// lost everything, only what this round sent: the next round sends
		// the rest of the local history, decayed.
		lost := lostTags[e.marker]
		held := locals[i]
		if lost {
			held = uint32(ds[i])
		}
		e.base.Store(packBase(held, now.UnixNano()/int64(e.tick)))
		e.reseed.Store(lost)
		e.valTick.Store(res[i].tick)
		e.val.Store(res[i].c)
		e.synced.Store(true)
	}
	f.keySyncs.Add(uint64(synced))
	if err != nil {
		f.roundErrors.Add(1)
		if f.up.Swap(false) || f.lastOK.Load() == 0 {
			f.log.Warn("fleet: Redis unreachable: enforcing limits locally at 1/N", "err", err.Error(), "replicas", f.replicas())
		}
		return false
	}
	f.rttNs.Store(int64(time.Since(start)))
	f.lastOK.Store(f.now().UnixNano())
	if card != nil {
		f.n.Store(max(1, card.Val()))
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
	now := f.now().UnixNano()
	for _, e := range es {
		p := f.promoteAt(e.theta)
		local := e.sk.EstimateBytes(e.skey)
		unsent := local > e.baseAt(now/int64(e.tick))
		if local >= max(1, p/4) || e.val.Load() >= int64(p) || e.reseed.Load() || unsent {
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
