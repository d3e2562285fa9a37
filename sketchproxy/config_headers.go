package sketchproxy

// HeadersConfig picks the rate-limit headers sent.
type HeadersConfig struct {
	// Legacy adds X-RateLimit-Limit, -Remaining and -Reset beside the IETF
	// draft's RateLimit-Policy and RateLimit.
	Legacy bool `yaml:"legacy"`
	// Off sends no rate-limit headers on allowed responses (429s keep them).
	Off bool `yaml:"off"`
}
