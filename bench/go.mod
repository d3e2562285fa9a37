module github.com/epochsketch/epochsketch/bench

go 1.26.0

require (
	github.com/epochsketch/epochsketch v0.0.0
	github.com/go-chi/httprate v0.16.1
	github.com/puzpuzpuz/xsync/v4 v4.5.0
	github.com/sethvargo/go-limiter v0.7.1
	github.com/tylertreat/BoomFilters v0.0.0-20251001182300-5b3723cc64ae
	github.com/ulule/limiter/v3 v3.11.2
	golang.org/x/time v0.16.0
)

require (
	github.com/d4l3k/messagediff v1.2.1 // indirect
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/zeebo/xxh3 v1.0.2 // indirect
	golang.org/x/sys v0.30.0 // indirect
)

replace github.com/epochsketch/epochsketch => ../
