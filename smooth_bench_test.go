package epochsketch_test

import (
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/internal/admit"
	"github.com/epochsketch/epochsketch/internal/keystream"
)

// BenchmarkAllowDecay sets package limit's conditional add, as Allow calls
// it, on a sketch with smooth decay beside one that halves at each tick's
// end, with the same tick (1 s) and table (4 MiB), a limit no key reaches
// (2^18 counts: within the table's counts at every step):
// what smooth decay costs an add (compare with benchstat -col /decay).
func BenchmarkAllowDecay(b *testing.B) {
	for _, w := range []*keystream.Stream{keystream.Zipf(1), keystream.Hot()} {
		for _, smooth := range []bool{false, true} {
			name := "halving"
			if smooth {
				name = "smooth"
			}
			b.Run("workload="+w.Name+"/decay="+name, func(b *testing.B) {
				sk := epochsketch.New(epochsketch.Config{NumBuckets: 1 << 16, TickDuration: time.Second, Hash: epochsketch.HashSipHash13, SmoothDecay: smooth})
				b.Cleanup(func() { sk.Close() })
				allow := admit.BindAllow(sk)
				for i := range 1 << 20 {
					allow(w.String(i), 2, 1<<18)
				}
				b.ResetTimer()
				ok := 0
				for i := range b.N {
					if allow(w.String(i), 2, 1<<18) {
						ok++
					}
				}
				if ok == 0 {
					b.Fatal("nothing admitted")
				}
			})
		}
	}
}
