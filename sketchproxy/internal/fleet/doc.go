// Package fleet shares SketchProxy's limits among replicas through Redis
// (docs/fleets.md): a key heavy enough to matter joins the hot set, its
// threshold is cut into the replicas' shares (share.go), and a sync
// goroutine writes each replica's signed records and reads the others'
// (sync.go, claims.go, redis.go). The engine asks it through engine.Fleet;
// the proxy, the Limiter and the Caddy module each make one from a
// config.FleetConfig (New, Open). It imports config and engine, never the
// proxy's root package.
package fleet
