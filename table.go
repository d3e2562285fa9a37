package epochsketch

import (
	"sync/atomic"
	"unsafe"
)

// bucket is 8 slots in one 64-byte cache line: the only memory an Observe
// touches (docs/DESIGN.md, Buckets).
type bucket struct {
	s [slotsPerBucket]atomic.Uint64
}

const bucketSize = int(unsafe.Sizeof(bucket{}))

// newTable returns n zeroed buckets starting on a cache-line boundary. The
// allocator aligns only to its size class, so the table is cut from a byte
// buffer one line larger; the buffer holds no pointers, so the garbage
// collector never scans it.
func newTable(n int) []bucket {
	raw := make([]byte, (n+1)*bucketSize)
	off := (cacheLine - int(uintptr(unsafe.Pointer(&raw[0]))%cacheLine)) % cacheLine
	return unsafe.Slice((*bucket)(unsafe.Pointer(&raw[off])), n)
}
