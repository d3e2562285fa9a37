package config

// HeadersConfig picks the rate-limit headers sent: by default the IETF
// draft's RateLimit-Policy and RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers-10), on every answer.
type HeadersConfig struct {
	// Legacy adds X-RateLimit-Limit, -Remaining and -Reset beside the IETF
	// draft's RateLimit-Policy and RateLimit.
	Legacy bool `yaml:"legacy" example:"true"`
	// Off sends no rate-limit headers on allowed responses (429s keep them).
	Off bool `yaml:"off" example:"true"`
}
