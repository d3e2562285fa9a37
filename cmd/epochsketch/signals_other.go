//go:build !unix

package main

import (
	"os"
	"syscall"
)

// stopSignals end a top run with its report and state (no SIGPIPE here).
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM}
