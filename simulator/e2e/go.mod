module github.com/epochsketch/epochsketch/simulator/e2e

go 1.25

require (
	github.com/chromedp/chromedp v0.23.1
	github.com/epochsketch/epochsketch v0.0.0
)

require (
	github.com/chromedp/cdproto v0.160.1 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
)

replace github.com/epochsketch/epochsketch => ../..
