package config

import "fmt"

// SketchConfig sizes the sketches: one per distinct tick among the limits.
type SketchConfig struct {
	// Buckets per sketch, 1 to 2^26, of 64 bytes each: 65536 are 4 MiB
	// and hold about 130k keys above the noise (see
	// epochsketch.BucketsFor).
	Buckets int `yaml:"buckets" example:"65536"`
	// TwoChoice gives each key two candidate buckets (more churn-proof).
	TwoChoice bool `yaml:"two_choice" example:"true"`
}

// prepare applies the sketch section's default and bounds.
func (s *SketchConfig) prepare(c *Config) error {
	if s.Buckets == 0 {
		s.Buckets = 1 << 16
	}
	if s.Buckets < 1 || s.Buckets > 1<<26 {
		return c.errAt(fmt.Sprintf("%d: want 1 to 2^26 (4 GiB)", s.Buckets), "sketch", "buckets")
	}
	return nil
}
