//go:build unix

package main

import (
	"os"
	"syscall"
)

// stopSignals end a top run with its report and state: Ctrl-C, SIGTERM, and
// SIGPIPE, so that a closed standard output (| head) makes writes fail
// instead of killing the process before the state is saved.
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGPIPE}
