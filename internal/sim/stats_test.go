package sim

import (
	"math/rand/v2"
	"testing"
)

// Under the null hypothesis about 5% of p-values fall below 0.05; under a
// real shift nearly all do. Both tests, with and without ties.
func TestTwoSampleTests(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	draw := func(n int, shift float64, ties bool) []float64 {
		s := make([]float64, n)
		for i := range s {
			v := r.NormFloat64() + shift
			if ties {
				v = float64(int(v * 2))
			}
			s[i] = v
		}
		return s
	}
	for _, ties := range []bool{false, true} {
		var nullKS, nullAD, altKS, altAD int
		const trials = 300
		for range trials {
			a, b := draw(80, 0, ties), draw(60, 0, ties)
			if _, p := KS2(a, b); p < 0.05 {
				nullKS++
			}
			if _, p := AD2(a, b); p < 0.05 {
				nullAD++
			}
			c, d := draw(80, 0, ties), draw(60, 1, ties)
			if _, p := KS2(c, d); p < 0.05 {
				altKS++
			}
			if _, p := AD2(c, d); p < 0.05 {
				altAD++
			}
		}
		t.Logf("ties=%v: null rejections KS %d AD %d; shift detected KS %d AD %d (of %d)", ties, nullKS, nullAD, altKS, altAD, trials)
		// Binomial(300, 0.05): mean 15, sd 3.8. KS is conservative with ties.
		if nullKS > 30 || nullAD > 30 || nullAD < 3 {
			t.Errorf("ties=%v: null rejection counts KS %d AD %d out of line with 5%%", ties, nullKS, nullAD)
		}
		if altKS < 270 || altAD < 270 {
			t.Errorf("ties=%v: a one-sigma shift detected only KS %d AD %d of %d times", ties, altKS, altAD, trials)
		}
	}
}

func TestZipf(t *testing.T) {
	z := NewZipf(1000, 1.0, 1)
	var c [3]int
	for range 100_000 {
		if r := z.Next(); r < 3 {
			c[r]++
		}
	}
	// P(0)/P(1) = 2 and P(0)/P(2) = 3 for s = 1.
	if r := float64(c[0]) / float64(c[1]); r < 1.85 || r > 2.15 {
		t.Errorf("P(0)/P(1) = %.2f, want 2", r)
	}
	if r := float64(c[0]) / float64(c[2]); r < 2.75 || r > 3.25 {
		t.Errorf("P(0)/P(2) = %.2f, want 3", r)
	}
}

func TestOracle(t *testing.T) {
	o := NewOracle()
	for range 16 {
		o.Observe("k", 10)
	}
	if got := o.At("k", 12); got != 4 {
		t.Errorf("16 at tick 10 reads %d at 12, want 4", got)
	}
	if got := o.Observe("k", 13); got != 3 {
		t.Errorf("(16>>3)+1 = %d, want 3", got)
	}
}
