# EpochSketch: one entry point for the checks and the long runs.
# `make help` lists the targets; `make test` is what CI runs.
GO ?= go
# SHORT is -short in the default run, which measures behaviour on manual
# clocks in seconds; `make test-long` empties it, and the tests run their
# wall-clock repeats, floods and accuracy runs too.
SHORT ?= -short

.DEFAULT_GOAL := help
.PHONY: help test test-long test-core test-bench test-e2e test-sketchproxy test-caddy test-grpclimit test-readme \
	fuzz bench sketchproxy-bench rls-compare theory simulator scaling

help: ## list the targets
	@echo "usage: make TARGET"
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

test: test-readme test-core test-bench test-e2e test-sketchproxy test-caddy test-grpclimit ## the README's commands first (a minute), then every module's vet and tests, as CI runs them

test-long: ## the same without -short: the wall-clock repeats, floods and accuracy runs too, and the fleet's whole table (tens of minutes)
	$(MAKE) test SHORT= SKETCHPROXY_FLEET_LONG=1

test-core: ## the library and the epochsketch command: vet, race tests, the trace build and the command without -race (what the race detector only slows), the library's tests on 386, wasm builds
	$(GO) vet ./...
	$(GO) test $(SHORT) -race ./...
	$(GO) test $(SHORT) -tags epochsketch_trace .
	$(GO) test $(SHORT) ./cmd/epochsketch
	GOARCH=386 $(GO) vet ./...
	GO=$(GO) SHORT=$(SHORT) bash scripts/test386.sh
	GOOS=js GOARCH=wasm $(GO) vet ./...
	GOOS=js GOARCH=wasm $(GO) vet -tags epochsketch_trace ./...

test-bench: ## the peer benchmark harness (its own module), each benchmark once
	cd bench && $(GO) vet ./... && $(GO) test -bench 'Peers$$/workload=hot' -benchtime=1x ./...

test-e2e: ## the browser simulator driven in headless Chromium (its own module)
	cd simulator/e2e && $(GO) vet ./... && $(GO) test $(SHORT) ./...

test-sketchproxy: ## SketchProxy (its own module): vet and race tests, real redis-server and python3 included
	cd sketchproxy && $(GO) vet ./... && $(GO) test $(SHORT) -race ./...
	GO=$(GO) bash scripts/request-files.sh

test-caddy: ## the epochsketch Caddy module (its own module): vet, race tests, and tests that drive a Caddy built with it (the first build downloads Caddy: minutes)
	cd sketchproxy/caddy && $(GO) vet ./... && $(GO) test $(SHORT) -race ./...

test-grpclimit: ## package limit's gRPC interceptor (its own module): vet and race tests against a real gRPC server
	cd limit/grpclimit && $(GO) vet ./... && $(GO) test $(SHORT) -race ./...

test-readme: ## the short commands of the READMEs and SketchProxy's pages, run exactly as written
	bash scripts/readme-check.sh

fuzz: ## each fuzz target for 30 s (FUZZTIME=2m for longer)
	$(GO) test -run XXX -fuzz FuzzModel -fuzztime $(or $(FUZZTIME),30s) .
	$(GO) test -run XXX -fuzz FuzzSnapshot -fuzztime $(or $(FUZZTIME),30s) .
	cd sketchproxy && $(GO) test -run XXX -fuzz FuzzClientAddr -fuzztime $(or $(FUZZTIME),30s) .
	cd sketchproxy && $(GO) test -run XXX -fuzz FuzzPath -fuzztime $(or $(FUZZTIME),30s) .
	cd sketchproxy && $(GO) test -run XXX -fuzz FuzzHost -fuzztime $(or $(FUZZTIME),30s) .

bench: ## the core benchmarks and the peers, as BENCHMARKS.md reports them (minutes)
	bash scripts/bench.sh

sketchproxy-bench: ## SketchProxy's overhead against a plain reverse proxy, and wrk
	bash scripts/sketchproxy-bench.sh

rls-compare: ## SketchProxy's envoy_rls beside envoyproxy/ratelimit and Redis, one client's load (about 2 minutes; builds ratelimit once)
	bash scripts/rls-compare.sh

theory: ## regenerate THEORY.md's figures (docs/theory, about 7 minutes)
	bash scripts/theory.sh

simulator: ## rebuild the simulator's WebAssembly after a change to the package
	$(GO) generate ./simulator

scaling: ## prepare the GOMAXPROCS 1-16 scaling run for a many-core machine
	bash scripts/scaling.sh
