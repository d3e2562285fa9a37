package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// sdNotify sends state to systemd's notification socket (sd_notify(3)):
// READY=1 once this process serves (Type=notify), MAINPID= when a
// handover makes the successor the service's main process. Without
// NOTIFY_SOCKET (not under systemd, or not Type=notify) it does nothing.
// With barrier it then waits, as sd_notify_barrier(3) does, until systemd
// has read everything sent before it (it closes the pipe end it was
// passed), for at most 5 s: a main process that exits right after
// MAINPID= would otherwise race the message, and systemd would take the
// service for stopped and stop the successor too.
func sdNotify(state string, barrier bool) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	if path[0] == '@' { // an abstract socket
		path = "\x00" + path[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return err
	}
	if !barrier {
		return nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	// sendmsg on the connected socket itself: WriteMsgUnix refuses a
	// connected socket.
	rc, err := conn.SyscallConn()
	if err != nil {
		w.Close()
		return err
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		serr = syscall.Sendmsg(int(fd), []byte("BARRIER=1"), syscall.UnixRights(int(w.Fd())), nil, 0)
		return serr != syscall.EAGAIN
	})
	w.Close()
	if err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	r.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if _, err := r.Read(b[:]); err != io.EOF {
		return fmt.Errorf("BARRIER=1: systemd did not close the barrier's pipe: %v", err)
	}
	return nil // EOF: systemd read the messages before it
}
