package sim

import (
	"math"
	"sort"
	"strings"
)

// KV is a key and a count.
type KV struct {
	Key   string
	Count uint64
}

// SortKV sorts by count, largest first, then by key.
func SortKV(s []KV) {
	sort.Slice(s, func(i, j int) bool {
		if s[i].Count != s[j].Count {
			return s[i].Count > s[j].Count
		}
		return strings.Compare(s[i].Key, s[j].Key) < 0
	})
}

// KS2 is the two-sample Kolmogorov-Smirnov test: the statistic D and its
// asymptotic p-value (Kolmogorov distribution with the effective size
// n·m/(n+m) and Stephens' small-sample correction).
func KS2(a, b []float64) (d, p float64) {
	x := append([]float64(nil), a...)
	y := append([]float64(nil), b...)
	sort.Float64s(x)
	sort.Float64s(y)
	i, j := 0, 0
	for i < len(x) && j < len(y) {
		v := min(x[i], y[j])
		for i < len(x) && x[i] == v {
			i++
		}
		for j < len(y) && y[j] == v {
			j++
		}
		d = max(d, math.Abs(float64(i)/float64(len(x))-float64(j)/float64(len(y))))
	}
	ne := float64(len(x)*len(y)) / float64(len(x)+len(y))
	lambda := (math.Sqrt(ne) + 0.12 + 0.11/math.Sqrt(ne)) * d
	return d, kolmogorovQ(lambda)
}

// kolmogorovQ is P(K > lambda) for the Kolmogorov distribution.
func kolmogorovQ(lambda float64) float64 {
	if lambda < 1e-3 {
		return 1
	}
	sum := 0.0
	for k := 1; k <= 100; k++ {
		term := 2 * math.Pow(-1, float64(k-1)) * math.Exp(-2*float64(k*k)*lambda*lambda)
		sum += term
		if math.Abs(term) < 1e-12 {
			break
		}
	}
	return min(max(sum, 0), 1)
}

// AD2 is the two-sample Anderson-Darling test of Scholz and Stephens (1987),
// the version for samples with ties: the standardized statistic and an
// approximate p-value interpolated from the critical values of their table
// (clamped to [0.001, 0.25], as the table spans).
func AD2(a, b []float64) (t, p float64) {
	samples := [][]float64{a, b}
	var pooled []float64
	for _, s := range samples {
		pooled = append(pooled, s...)
	}
	sort.Float64s(pooled)
	n := float64(len(pooled))
	// Distinct values z_j and their multiplicities l_j.
	var z []float64
	var l []float64
	for i := 0; i < len(pooled); {
		j := i
		for j < len(pooled) && pooled[j] == pooled[i] {
			j++
		}
		z = append(z, pooled[i])
		l = append(l, float64(j-i))
		i = j
	}
	akn := 0.0
	for _, s := range samples {
		ss := append([]float64(nil), s...)
		sort.Float64s(ss)
		ni := float64(len(ss))
		bj, mij := 0.0, 0.0 // cumulative pooled count and sample count (midranks)
		k := 0
		inner := 0.0
		for j := range z {
			fij := 0.0
			for k < len(ss) && ss[k] == z[j] {
				fij++
				k++
			}
			mijMid := mij + fij/2
			bjMid := bj + l[j]/2
			num := n*mijMid - ni*bjMid
			den := bjMid*(n-bjMid) - n*l[j]/4
			if den > 0 {
				inner += l[j] / n * num * num / den
			}
			mij += fij
			bj += l[j]
		}
		akn += inner / ni
	}
	akn *= (n - 1) / n
	// Variance of A under H0 (Scholz-Stephens eq. 6), k = 2.
	kk := 2.0
	hh := 1.0/float64(len(a)) + 1.0/float64(len(b))
	// h = H(N-1); g = sum_{i=1}^{N-2} sum_{j=i+1}^{N-1} 1/((N-i) j)
	//   = sum_{i=1}^{N-2} (H(N-1) - H(i)) / (N-i), in O(N).
	N := len(pooled)
	harm := make([]float64, N) // harm[i] = H(i)
	for i := 1; i < N; i++ {
		harm[i] = harm[i-1] + 1/float64(i)
	}
	h := harm[N-1]
	g := 0.0
	for i := 1; i <= N-2; i++ {
		g += (h - harm[i]) / float64(N-i)
	}
	aa := (4*g-6)*(kk-1) + (10-6*g)*hh
	bb := (2*g-4)*kk*kk + 8*h*kk + (2*g-14*h-4)*hh - 8*h + 4*g - 6
	cc := (6*h+2*g-2)*kk*kk + (4*h-4*g+6)*kk + (2*h-6)*hh + 4*h
	dd := (2*h+6)*kk*kk - 4*h*kk
	sigma2 := (aa*n*n*n + bb*n*n + cc*n + dd) / ((n - 1) * (n - 2) * (n - 3))
	m := kk - 1
	t = (akn - m) / math.Sqrt(sigma2)
	return t, adPValue(t, m)
}

// adPValue interpolates log(significance) against the critical values
// b0 + b1/sqrt(m) + b2/m of Scholz and Stephens' Table 1.
func adPValue(t, m float64) float64 {
	sig := []float64{0.25, 0.1, 0.05, 0.025, 0.01, 0.005, 0.001}
	b0 := []float64{0.675, 1.281, 1.645, 1.96, 2.326, 2.573, 3.085}
	b1 := []float64{-0.245, 0.25, 0.678, 1.149, 1.822, 2.364, 3.615}
	b2 := []float64{-0.105, -0.305, -0.362, -0.391, -0.396, -0.345, -0.154}
	crit := make([]float64, len(sig))
	for i := range sig {
		crit[i] = b0[i] + b1[i]/math.Sqrt(m) + b2[i]/m
	}
	if t <= crit[0] {
		return sig[0]
	}
	if t >= crit[len(crit)-1] {
		return sig[len(sig)-1]
	}
	for i := 1; i < len(crit); i++ {
		if t <= crit[i] {
			f := (t - crit[i-1]) / (crit[i] - crit[i-1])
			return math.Exp(math.Log(sig[i-1]) + f*(math.Log(sig[i])-math.Log(sig[i-1])))
		}
	}
	return sig[len(sig)-1]
}

// Quantile returns the q-quantile of s (nearest rank).
func Quantile(s []float64, q float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	x := append([]float64(nil), s...)
	sort.Float64s(x)
	i := int(math.Ceil(q*float64(len(x)))) - 1
	return x[min(max(i, 0), len(x)-1)]
}

// Mean returns the arithmetic mean of s.
func Mean(s []float64) float64 {
	sum := 0.0
	for _, v := range s {
		sum += v
	}
	return sum / float64(len(s))
}
