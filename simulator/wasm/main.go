//go:build js && wasm && epochsketch_trace

// Command wasm is the browser simulator's engine: the real epochsketch
// package, built with its trace hooks on (-tags epochsketch_trace) for
// GOOS=js GOARCH=wasm, driven by simulator/epochsketch-simulator.html through
// the global object "epochsketch". The trace's types are internal/lab's, out
// of the library's API. Time is a ManualClock moved only by the
// page and the lottery is seeded (package engine), so a page and a Go
// program that make the same calls with the same seed hold the same bits.
package main

import (
	"fmt"
	"strconv"
	"syscall/js"

	"github.com/epochsketch/epochsketch/internal/lab"
	"github.com/epochsketch/epochsketch/simulator/engine"
)

var (
	cur    *engine.Sim
	events []lab.Event
)

func hex(w uint64) string { return fmt.Sprintf("%016x", w) }

func observe(key string) js.Value {
	events = events[:0]
	est, first := cur.Observe(key)
	evs := make([]any, len(events))
	for i, ev := range events {
		evs[i] = eventJS(ev)
	}
	b, second, tag := cur.Locate(key)
	return js.ValueOf(map[string]any{
		"key": key, "estimate": int(est), "first": first, "exact": float64(cur.Exact(key)),
		"bucket": b, "second": second, "tag": int(tag), "events": evs,
	})
}

func eventJS(ev lab.Event) map[string]any {
	m := map[string]any{"op": ev.Op.String(), "slot": ev.Slot, "ok": ev.OK, "tick": float64(ev.Tick)}
	switch ev.Op {
	case lab.Start:
		m["hash"], m["tag"], m["bucket"], m["second"] = hex(ev.Hash), int(ev.Tag), ev.Bucket, ev.Second
	case lab.Result:
		m["estimate"], m["first"] = int(ev.Est), ev.First
	case lab.Lottery:
		m["old"], m["victimCount"] = hex(ev.Old), int(ev.Est)
		m["draw"], m["bound"], m["sure"] = hex(ev.Draw), hex(ev.Bound), ev.Sure
	case lab.Drain:
		m["old"], m["into"] = hex(ev.Old), int(ev.Est)
	default:
		m["old"], m["new"] = hex(ev.Old), hex(ev.New)
	}
	return m
}

func state() js.Value {
	n := cur.Sketch.NumBuckets()
	words := make([]any, 0, n*8)
	for i := range n {
		for _, w := range cur.Slots(i) {
			words = append(words, hex(w))
		}
	}
	st := cur.Sketch.Stats()
	return js.ValueOf(map[string]any{
		"tick": float64(cur.Now()), "epoch": int(cur.Now() & (1<<24 - 1)), "ticks": float64(cur.Ticks()),
		"buckets": n, "words": words,
		"stats": map[string]any{
			"evictions": float64(st.Evictions), "chips": float64(st.Chips),
			"lost": float64(st.ChallengesLost), "scrubbed": float64(st.ScrubbedZombies),
			"casExhausted": float64(st.CASRetriesExhausted),
		},
	})
}

// fail is an error the page shows instead of an exception.
func fail(err error) js.Value { return js.ValueOf(map[string]any{"error": err.Error()}) }

// fn wraps an API call that needs a simulation and n arguments.
func fn(n int, f func(args []js.Value) js.Value) js.Func {
	return js.FuncOf(func(_ js.Value, args []js.Value) any {
		if cur == nil {
			return fail(fmt.Errorf("no simulation: call reset first"))
		}
		if len(args) != n {
			return fail(fmt.Errorf("want %d arguments, got %d", n, len(args)))
		}
		return f(args)
	})
}

func main() {
	lab.SetTracer(func(ev lab.Event) { events = append(events, ev) })
	api := js.Global().Get("Object").New()
	api.Set("reset", js.FuncOf(func(_ js.Value, args []js.Value) any {
		if len(args) != 4 {
			return fail(fmt.Errorf("reset(seed, buckets, lottery, twoChoice): got %d arguments", len(args)))
		}
		seed, err := strconv.ParseUint(args[0].String(), 10, 64)
		if err != nil || seed == 0 {
			return fail(fmt.Errorf("seed %q: want a whole number from 1 to 2^64-1", args[0].String()))
		}
		s, err := engine.New(seed, args[1].Int(), args[2].String(), args[3].Bool())
		if err != nil {
			return fail(err)
		}
		cur = s
		return state()
	}))
	api.Set("observe", fn(1, func(a []js.Value) js.Value { return observe(a[0].String()) }))
	api.Set("estimate", fn(1, func(a []js.Value) js.Value {
		k := a[0].String()
		return js.ValueOf(map[string]any{"estimate": int(cur.Sketch.Estimate(k)), "exact": float64(cur.Exact(k))})
	}))
	api.Set("nextKey", fn(2, func(a []js.Value) js.Value {
		k, err := cur.NextKey(a[0].String(), a[1].Int())
		if err != nil {
			return fail(err)
		}
		return js.ValueOf(k)
	}))
	api.Set("advance", fn(1, func(a []js.Value) js.Value {
		cur.Advance(int64(a[0].Float()))
		return state()
	}))
	api.Set("state", fn(0, func([]js.Value) js.Value { return state() }))
	api.Set("locate", fn(1, func(a []js.Value) js.Value {
		b, b2, tag := cur.Locate(a[0].String())
		return js.ValueOf(map[string]any{"bucket": b, "second": b2, "tag": int(tag)})
	}))
	api.Set("wrapTicks", engine.WrapTicks)
	js.Global().Set("epochsketch", api)
	js.Global().Call("dispatchEvent", js.Global().Get("Event").New("epochsketch-ready"))
	select {}
}
