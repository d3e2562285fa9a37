package jwtauth

// Fetcher is a verifier's JWKS fetch loop as the tests of the doors that
// use the verifier drive it: they run a JWKS endpoint and need to know when
// a fetch was asked for, taken and judged.
type Fetcher struct{ s *jwksSource }

// Fetcher is v's fetch loop; ok is false when v's keys are not fetched
// from a jwks_url.
func (v *Verifier) Fetcher() (f Fetcher, ok bool) { return Fetcher{v.jwks}, v.jwks != nil }

// URL is the key set's address.
func (f Fetcher) URL() string { return f.s.url }

// Ready is closed at the first fetch that brought usable keys.
func (f Fetcher) Ready() <-chan struct{} { return f.s.ready }

// Unspaced lets fetches asked for by unknown keys follow each other at
// once, not jwksKickEvery apart.
func (f Fetcher) Unspaced() { f.s.spacing.Store(0) }

// Kick asks for a fetch, waiting while one asked for is not yet taken.
func (f Fetcher) Kick() { f.s.kick <- struct{}{} }

// Pending is the number of fetches asked for and not yet taken: 0 or 1.
func (f Fetcher) Pending() int { return len(f.s.kick) }
