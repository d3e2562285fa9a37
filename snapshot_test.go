package epochsketch_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/internal/lab"

	"github.com/epochsketch/epochsketch/atomicfile"

	"github.com/epochsketch/epochsketch"
)

func snapCfg(seed uint64) epochsketch.Config {
	return epochsketch.Config{NumBuckets: 64, TickDuration: time.Second, Hash: epochsketch.HashSipHash13, Seed: seed}
}

func fill(sk *epochsketch.Sketch, n int) {
	for i := range n {
		for range 1 + i%40 {
			sk.Observe(fmt.Sprint("key", i))
		}
	}
}

func TestSnapshotRoundTripAndDowntimeDecay(t *testing.T) {
	for _, seed := range []uint64{0, 7} {
		cfg := snapCfg(seed)
		clk := epochsketch.NewManualClock(t0)
		cfg.Clock = clk
		a := epochsketch.New(cfg)
		fill(a, 300)
		data, err := marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(data)) != epochsketch.SnapshotSize(64) {
			t.Fatalf("snapshot of %d bytes, SnapshotSize says %d", len(data), epochsketch.SnapshotSize(64))
		}
		for _, down := range []time.Duration{0, 3 * time.Second, 23 * time.Second} {
			clk2 := epochsketch.NewManualClock(t0.Add(down))
			cfg2 := snapCfg(seed)
			cfg2.Clock = clk2
			b := epochsketch.New(cfg2)
			if err := unmarshal(b, data); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			// The original, run through the same downtime, reads the same.
			clk.Set(t0.Add(down))
			for i := range 300 {
				k := fmt.Sprint("key", i)
				if ga, gb := a.Estimate(k), b.Estimate(k); ga != gb {
					t.Fatalf("seed %d, down %v: %s reads %d restored, %d had it run", seed, down, k, gb, ga)
				}
			}
			// And it keeps working the same way.
			if ea, _ := a.Observe("key5"); func() bool { eb, _ := b.Observe("key5"); return eb != ea }() {
				t.Fatalf("seed %d: Observe differs after restore", seed)
			}
			clk.Set(t0)
			a = epochsketch.New(cfg)
			cfg.Clock = clk
			if err := unmarshal(a, data); err != nil { // back to the snapshot's state
				t.Fatal(err)
			}
		}
	}
}

// A downtime of a whole epoch wrap (2^24 ticks) or more, or near it,
// resurrects nothing; without the restore's check the same slots would read
// as zombies.
func TestSnapshotLongDowntimeResurrectsNothing(t *testing.T) {
	cfg := snapCfg(3)
	clk := epochsketch.NewManualClock(t0)
	cfg.Clock = clk
	a := epochsketch.New(cfg)
	fill(a, 200)
	data, _ := marshal(a)
	for _, ticks := range []int64{24, 30, 1<<24 - 1, 1 << 24, 1<<24 + 1, 3 << 24} {
		cfg2 := snapCfg(3)
		cfg2.Clock = epochsketch.NewManualClock(t0.Add(time.Duration(ticks) * time.Second))
		b := epochsketch.New(cfg2)
		if err := unmarshal(b, data); err != nil {
			t.Fatal(err)
		}
		for i := range 200 {
			if e := b.Estimate(fmt.Sprint("key", i)); e != 0 {
				t.Fatalf("after %d ticks down, key%d reads %d", ticks, i, e)
			}
		}
		for i := range 64 {
			if w := lab.Slots(b, i); w != [8]uint64{} {
				t.Fatalf("after %d ticks down, bucket %d holds %x", ticks, i, w)
			}
		}
	}
	// The zombie the check prevents: the live sketch, left idle a whole wrap.
	clk.Advance((1 << 24) * time.Second)
	zombies := 0
	for i := range 200 {
		if a.Estimate(fmt.Sprint("key", i)) != 0 {
			zombies++
		}
	}
	if zombies == 0 {
		t.Error("the idle original shows no zombie: the test no longer shows what the restore prevents")
	}
}

func TestSnapshotMismatch(t *testing.T) {
	a := epochsketch.New(snapCfg(5))
	data, _ := marshal(a)
	for _, c := range []struct {
		field string
		cfg   epochsketch.Config
	}{
		{"NumBuckets", epochsketch.Config{NumBuckets: 128, TickDuration: time.Second, Hash: epochsketch.HashSipHash13, Seed: 5}},
		{"TickDuration", epochsketch.Config{NumBuckets: 64, TickDuration: time.Minute, Hash: epochsketch.HashSipHash13, Seed: 5}},
		{"Hash", epochsketch.Config{NumBuckets: 64, TickDuration: time.Second, Hash: epochsketch.HashWyhash, Seed: 5}},
		{"TwoChoice", epochsketch.Config{NumBuckets: 64, TickDuration: time.Second, Hash: epochsketch.HashSipHash13, Seed: 5, TwoChoice: true}},
		{"Seed", epochsketch.Config{NumBuckets: 64, TickDuration: time.Second, Hash: epochsketch.HashSipHash13, Seed: 6}},
	} {
		err := unmarshal(epochsketch.New(c.cfg), data)
		var se *epochsketch.SnapshotError
		if !errors.As(err, &se) || se.Field != c.field || !strings.Contains(err.Error(), "Config."+c.field) {
			t.Errorf("%s: %v", c.field, err)
		}
	}
	// The lottery is not a Config field, but a snapshot of the simulator's
	// chip lottery still restores only into a sketch that runs it.
	chipped := epochsketch.New(snapCfg(5))
	lab.UseChip(chipped)
	if err := unmarshal(chipped, data); err == nil || !strings.Contains(err.Error(), "chip lottery") {
		t.Errorf("a HeavyKeeper snapshot into a chip sketch: %v", err)
	}
	if _, err := marshal(epochsketch.New(epochsketch.Config{NumBuckets: 64, Hash: epochsketch.HashMaphash})); !errors.Is(err, epochsketch.ErrMaphashSnapshot) {
		t.Errorf("a maphash sketch saved: %v", err)
	}
}

// resum rewrites a snapshot header's checksum after a test changed a field.
func resum(b []byte) {
	binary.LittleEndian.PutUint32(b[88:], crc32.Checksum(b[:88], crc32.MakeTable(crc32.Castagnoli)))
}

// A snapshot names its hash by the format's code, not by HashKind's value,
// so that files written before HashDefault left still read: wyhash 2,
// maphash 1, SipHash-1-3 3.
func TestSnapshotHashCodes(t *testing.T) {
	for _, c := range []struct {
		kind epochsketch.HashKind
		code byte
	}{{epochsketch.HashWyhash, 2}, {epochsketch.HashSipHash13, 3}} {
		data, err := marshal(epochsketch.New(epochsketch.Config{NumBuckets: 1, Hash: c.kind, Seed: 1}))
		if err != nil || data[12] != c.code {
			t.Errorf("%v: header code %d (%v), want %d", c.kind, data[12], err, c.code)
		}
	}
}

// Damaged, truncated, foreign and future files are refused with a clear
// error, and the sketch is left empty and working.
func TestSnapshotDamage(t *testing.T) {
	a := epochsketch.New(snapCfg(9))
	fill(a, 300)
	good, _ := marshal(a)
	mut := func(f func([]byte)) []byte { b := bytes.Clone(good); f(b); return b }
	for _, c := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "truncated: the header (0 of 96 bytes)"},
		{"foreign", []byte("GIF89a and then some more bytes to pass the header length ..........................................."), `not an EpochSketch snapshot (the file starts "GIF89a a"`},
		{"future version", mut(func(b []byte) { b[8] = 9 }), "format version 9 was written by a newer epochsketch"},
		{"header bit flip", mut(func(b []byte) { b[20] ^= 1 }), "header checksum mismatch"},
		{"unknown hash code", mut(func(b []byte) { b[12] = 9; resum(b) }), "hash code 9 names no hash"},
		{"body bit flip", mut(func(b []byte) { b[500] ^= 4 }), "body checksum mismatch"},
		{"trailer damaged", mut(func(b []byte) { b[len(b)-1] = 'X' }), "body checksum mismatch"},
		{"truncated body", good[:2000], "truncated: the body (2000 of"},
		{"truncated trailer", good[:len(good)-3], "truncated: the trailer"},
	} {
		b := epochsketch.New(snapCfg(9))
		b.Observe("before")
		err := unmarshal(b, c.data)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
			continue
		}
		for i := range 64 {
			if w := lab.Slots(b, i); w != [8]uint64{} && c.name != "empty" && c.name != "foreign" && c.name != "future version" && c.name != "header bit flip" && c.name != "unknown hash code" {
				t.Fatalf("%s: a failed restore left bucket %d: %x", c.name, i, w)
			}
		}
		if e, _ := b.Observe("after"); e != 1 {
			t.Errorf("%s: the sketch does not work after a failed restore", c.name)
		}
	}
}

// A snapshot taken while writers run is a valid state: it restores, and
// every slot decodes to a live count.
func TestSnapshotUnderConcurrentObserve(t *testing.T) {
	cfg := epochsketch.Config{NumBuckets: 1024, Hash: epochsketch.HashWyhash}
	a := epochsketch.New(cfg)
	defer a.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				a.Observe(fmt.Sprint(g, "-", i%5000))
			}
		}()
	}
	for range 20 {
		data, err := marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		b := epochsketch.New(cfg)
		if err := unmarshal(b, data); err != nil {
			t.Fatalf("a snapshot taken under writers does not restore: %v", err)
		}
		for i := range 1024 {
			for _, w := range lab.Slots(b, i) {
				if _, _, c := lab.Fields(w); w != 0 && c == 0 {
					t.Fatalf("a torn word: %x", w)
				}
			}
		}
		b.Close()
	}
	close(stop)
	wg.Wait()
}

// WriteTo streams: it never holds more than a 64 KiB chunk, whatever the
// table's size, and ReadFrom reads from a stream.
func TestSnapshotStreams(t *testing.T) {
	cfg := epochsketch.Config{NumBuckets: 1 << 18, Hash: epochsketch.HashWyhash, Seed: 1, TickDuration: time.Second, Clock: epochsketch.NewManualClock(t0)}
	a := epochsketch.New(cfg)
	fill(a, 1000)
	w := &maxWrite{}
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() { _, err := a.WriteTo(io.MultiWriter(pw, w)); pw.CloseWithError(err); close(done) }()
	b := epochsketch.New(cfg)
	if _, err := b.ReadFrom(pr); err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, pr)
	<-done
	if w.max > 1<<16 {
		t.Errorf("a write of %d bytes: WriteTo buffers more than a chunk", w.max)
	}
	if w.n != epochsketch.SnapshotSize(1<<18) {
		t.Errorf("wrote %d bytes", w.n)
	}
	if a.Estimate("key39") != b.Estimate("key39") || b.Estimate("key39") == 0 {
		t.Error("the streamed restore differs")
	}
}

type maxWrite struct{ n, max int64 }

func (m *maxWrite) Write(p []byte) (int, error) {
	m.n += int64(len(p))
	m.max = max(m.max, int64(len(p)))
	return len(p), nil
}

func TestSaveAndLoadFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.snap")
	cfg := snapCfg(11)
	cfg.Clock = epochsketch.NewManualClock(t0)
	a := epochsketch.New(cfg)
	fill(a, 100)
	if err := a.SaveFile(p); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 {
		t.Errorf("the snapshot is %v: it holds the hash key, want 0600", st.Mode().Perm())
	}
	b := epochsketch.New(cfg)
	info, err := b.LoadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Saved.Equal(t0) || info.Live == 0 || info.Expired != 0 {
		t.Errorf("info %+v", info)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
	if _, err := b.LoadFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
	// A file with anything after the snapshot is not the file SaveFile wrote:
	// refused, and the sketch left empty.
	data, _ := os.ReadFile(p)
	longer := filepath.Join(dir, "longer.snap")
	os.WriteFile(longer, append(data, 0), 0o600)
	c := epochsketch.New(cfg)
	if _, err := c.LoadFile(longer); err == nil || !strings.Contains(err.Error(), "bytes after the end of the snapshot") {
		t.Errorf("a file with a byte after the snapshot: %v", err)
	}
	if e := c.Estimate("key1"); e != 0 {
		t.Errorf("a refused file left state: Estimate %d", e)
	}
}

// LoadFrom restores a snapshot from the middle of a stream of the caller's,
// says what it held, and leaves the reader just after it.
func TestLoadFromStream(t *testing.T) {
	cfg := snapCfg(11)
	cfg.Clock = epochsketch.NewManualClock(t0)
	a := epochsketch.New(cfg)
	fill(a, 100)
	var stream bytes.Buffer
	stream.WriteString("HEAD")
	a.WriteTo(&stream)
	a.WriteTo(&stream)
	stream.WriteString("TAIL")
	r := bytes.NewReader(stream.Bytes())
	r.Seek(4, io.SeekStart)

	fresh := epochsketch.NewManualClock(t0.Add(2 * time.Second))
	cfg.Clock = fresh
	b := epochsketch.New(cfg)
	info, err := b.LoadFrom(r)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Saved.Equal(t0) || info.Live == 0 || info.Expired != 0 || b.Estimate("key39") == 0 {
		t.Errorf("the first snapshot: %+v, key39 reads %d", info, b.Estimate("key39"))
	}
	// The second copy, restored 30 ticks later: every slot has evaporated.
	cfg.Clock = epochsketch.NewManualClock(t0.Add(30 * time.Second))
	c := epochsketch.New(cfg)
	late, err := c.LoadFrom(r)
	if err != nil {
		t.Fatal(err)
	}
	if late.Live != 0 || late.Expired != info.Live {
		t.Errorf("30 ticks later: %+v, want every one of the %d live slots expired", late, info.Live)
	}
	if rest, _ := io.ReadAll(r); string(rest) != "TAIL" {
		t.Errorf("LoadFrom left %q in the stream, want the caller's TAIL", rest)
	}
	// A stream cut inside a snapshot is an error, and the sketch stays empty.
	d := epochsketch.New(cfg)
	cut := stream.Bytes()[4 : 4+2000]
	if _, err := d.LoadFrom(bytes.NewReader(cut)); !errors.Is(err, io.ErrUnexpectedEOF) || d.Estimate("key39") != 0 {
		t.Errorf("a cut stream: %v, key39 reads %d", err, d.Estimate("key39"))
	}
}

// A writer killed in the middle of SaveFile leaves the previous snapshot
// whole. The writer is this test binary, re-run as a child that saves a
// 64 MiB sketch through a slow writer, and is killed while writing.
func TestSaveFileSurvivesAKilledWriter(t *testing.T) {
	startsProcesses(t)
	if os.Getenv("EPOCHSKETCH_SLOW_WRITER") == "" {
		skipUnderRace(t)
	}
	if os.Getenv("EPOCHSKETCH_SLOW_WRITER") != "" {
		cfg := epochsketch.Config{NumBuckets: 1 << 20, Hash: epochsketch.HashWyhash, Seed: 2, TickDuration: time.Second, Clock: epochsketch.NewManualClock(t0)}
		s := epochsketch.New(cfg)
		fill(s, 500)
		atomicfile.Write(os.Getenv("EPOCHSKETCH_SLOW_WRITER"), 0o600, func(w io.Writer) error {
			_, err := s.WriteTo(slowWriter{w})
			return err
		})
		return
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "state.snap")
	cfg := epochsketch.Config{NumBuckets: 1 << 20, Hash: epochsketch.HashWyhash, Seed: 2, TickDuration: time.Second, Clock: epochsketch.NewManualClock(t0)}
	old := epochsketch.New(cfg)
	old.ObserveN(time.Time{}, "the old one", 1234)
	if err := old.SaveFile(p); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSaveFileSurvivesAKilledWriter$")
	cmd.Env = append(os.Environ(), "EPOCHSKETCH_SLOW_WRITER="+p)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill it once its temporary file has grown past a few chunks.
	deadline := time.Now().Add(20 * time.Second)
	for {
		m, _ := filepath.Glob(filepath.Join(dir, ".state.snap.tmp-*"))
		if len(m) == 1 {
			if st, err := os.Stat(m[0]); err == nil && st.Size() > 1<<18 {
				break
			}
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the child never started writing")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	b := epochsketch.New(cfg)
	if _, err := b.LoadFile(p); err != nil {
		t.Fatalf("the previous snapshot is damaged after a killed write: %v", err)
	}
	if e := b.Estimate("the old one"); e != 1234 {
		t.Errorf("the previous snapshot reads %d, want 1234", e)
	}
}

type slowWriter struct{ w io.Writer }

func (s slowWriter) Write(p []byte) (int, error) {
	time.Sleep(2 * time.Millisecond)
	return s.w.Write(p)
}

func TestTopKSnapshot(t *testing.T) {
	a := epochsketch.NewTopK(5)
	for i := range 20 {
		a.Offer(fmt.Sprint("k", i), uint32(i*3))
	}
	data, err := marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	b := epochsketch.NewTopK(5)
	if err := unmarshal(b, data); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(a.List()) != fmt.Sprint(b.List()) {
		t.Fatalf("%v != %v", a.List(), b.List())
	}
	if err := unmarshal(epochsketch.NewTopK(3), data); err == nil || !strings.Contains(err.Error(), "do not fit a TopK of k = 3") {
		t.Errorf("a smaller TopK: %v", err)
	}
	for i := range len(data) {
		if err := unmarshal(epochsketch.NewTopK(5), data[:i]); err == nil {
			t.Fatalf("truncated at %d accepted", i)
		}
	}
	bad := bytes.Clone(data)
	bad[len(bad)/2] ^= 0x20
	if err := unmarshal(epochsketch.NewTopK(5), bad); err == nil {
		t.Error("a damaged TopK snapshot accepted")
	}
	// A sketch and its TopK in one stream: each reads exactly its part.
	var buf bytes.Buffer
	sk := epochsketch.New(snapCfg(4))
	sk.Observe("x")
	sk.WriteTo(&buf)
	a.WriteTo(&buf)
	sk2, tk2 := epochsketch.New(snapCfg(4)), epochsketch.NewTopK(5)
	if _, err := sk2.ReadFrom(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := tk2.ReadFrom(&buf); err != nil || buf.Len() != 0 || sk2.Estimate("x") != 1 {
		t.Fatalf("stream: %v, %d left", err, buf.Len())
	}
}

// FuzzSnapshot feeds the decoder anything: it must return an error or a
// valid sketch, never panic, and leave the sketch usable.
func FuzzSnapshot(f *testing.F) {
	a := epochsketch.New(epochsketch.Config{NumBuckets: 2, TickDuration: time.Second, Hash: epochsketch.HashWyhash, Seed: 1})
	a.Observe("a")
	a.Observe("b")
	good, _ := marshal(a)
	f.Add(good)
	f.Add(good[:50])
	f.Add([]byte("EPOCHSKT"))
	tk := epochsketch.NewTopK(3)
	tk.Offer("x", 5)
	tgood, _ := marshal(tk)
	f.Add(tgood)
	bt := epochsketch.NewTopKFor(a, 3)
	bt.Observe("y")
	bgood, _ := marshal(bt)
	f.Add(bgood)
	f.Fuzz(func(t *testing.T, data []byte) {
		s := epochsketch.New(epochsketch.Config{NumBuckets: 2, TickDuration: time.Second, Hash: epochsketch.HashWyhash, Seed: 1})
		if _, err := s.ReadFrom(bytes.NewReader(data)); err != nil {
			for i := range 2 {
				if lab.Slots(s, i) != [8]uint64{} {
					t.Fatal("a failed restore left state")
				}
			}
		}
		s.Observe("works")
		epochsketch.NewTopK(3).ReadFrom(bytes.NewReader(data))
		bt := epochsketch.NewTopKFor(s, 3)
		if _, err := bt.ReadFrom(bytes.NewReader(data)); err == nil {
			bt.Observe("works")
			for _, e := range bt.List() {
				if e.Estimate == 0 || e.Estimate > epochsketch.MaxCount {
					t.Fatalf("a restored entry reads %d", e.Estimate)
				}
			}
		}
	})
}

// The README's example sketch (its Config has no Hash and no Seed) can be
// saved and restored: the default hash's random key travels in the file.
func TestDefaultConfigSavesAndRestores(t *testing.T) {
	clk := epochsketch.NewManualClock(t0) // no tick boundary between the calls
	for _, cfg := range []epochsketch.Config{
		{},
		{NumBuckets: 1 << 16, TickDuration: time.Second}, // the README's example
	} {
		cfg.Clock = clk
		sk := epochsketch.New(cfg)
		for i := 0; i < 3; i++ {
			sk.Observe("api_client:192.168.1.50")
		}
		path := filepath.Join(t.TempDir(), "sketch")
		if err := sk.SaveFile(path); err != nil {
			t.Fatalf("%+v: saving the default sketch: %v", cfg, err)
		}
		sk.Close()
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%+v: the snapshot holds the hash key, want mode 0600: %v %v", cfg, fi.Mode(), err)
		}
		back := epochsketch.New(cfg)
		if _, err := back.LoadFile(path); err != nil {
			t.Fatalf("%+v: restoring: %v", cfg, err)
		}
		if est := back.Estimate("api_client:192.168.1.50"); est != 3 {
			t.Errorf("%+v: restored estimate %d, want 3", cfg, est)
		}
		if est, first := back.Observe("api_client:10.0.0.1"); est != 1 || !first {
			t.Errorf("%+v: a new key after the restore: %d %v", cfg, est, first)
		}
		back.Close()
	}
}

// errReader fails with its error after n bytes.
type errReader struct {
	data []byte
	err  error
}

func (r *errReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

// A truncated snapshot's error unwraps to io.ErrUnexpectedEOF, and a
// reader's own error passes through, for the sketch and for the TopK.
func TestSnapshotErrorsUnwrap(t *testing.T) {
	a := epochsketch.New(snapCfg(9))
	a.Observe("k")
	good, _ := marshal(a)
	tk := epochsketch.NewTopK(3)
	tk.Offer("x", 5)
	tgood, _ := marshal(tk)
	disk := errors.New("disk on fire")
	for _, c := range []struct {
		name string
		read func(io.Reader) error
		data []byte
	}{
		{"sketch", func(r io.Reader) error { _, err := epochsketch.New(snapCfg(9)).ReadFrom(r); return err }, good},
		{"topk", func(r io.Reader) error { _, err := epochsketch.NewTopK(3).ReadFrom(r); return err }, tgood},
	} {
		for _, cut := range []int{0, 5, len(c.data) / 2, len(c.data) - 1} {
			err := c.read(bytes.NewReader(c.data[:cut]))
			var se *epochsketch.SnapshotError
			if !errors.As(err, &se) || !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("%s cut at %d: %v, want a SnapshotError wrapping io.ErrUnexpectedEOF", c.name, cut, err)
			}
			err = c.read(&errReader{data: bytes.Clone(c.data[:cut]), err: disk})
			if !errors.Is(err, disk) || strings.Contains(err.Error(), "truncated") {
				t.Errorf("%s failing at %d: %v, want the reader's error passed through", c.name, cut, err)
			}
		}
	}
}

// marshal returns v's snapshot (WriteTo) in memory.
func marshal(v io.WriterTo) ([]byte, error) {
	var b bytes.Buffer
	_, err := v.WriteTo(&b)
	return b.Bytes(), err
}

// unmarshal restores data into v with ReadFrom; bytes left after the
// snapshot are an error, as they are in a file for LoadFile.
func unmarshal(v io.ReaderFrom, data []byte) error {
	r := bytes.NewReader(data)
	if _, err := v.ReadFrom(r); err != nil {
		return err
	}
	if r.Len() != 0 {
		return fmt.Errorf("%d bytes after the end of the snapshot", r.Len())
	}
	return nil
}
