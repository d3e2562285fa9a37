package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy"
)

// Restarts without a gap. Two ways, which combine
// (sketchproxy/docs/operations.md, "Restarts without a gap"):
//
// The handover (SIGUSR2): the running process saves the state file and
// starts its successor, the binary at its own path with its own flags,
// handing it every listening socket (inherited file descriptors from 3,
// named in SKETCHPROXY_HANDOVER as systemd names its sockets) and the
// write end of a pipe, and, where the config has no state_file, the state
// itself (handoverState). The successor reads the config and the state,
// serves on the sockets, and writes a byte to the pipe: only then does the
// old process stop accepting, finish what it has in flight (a GOAWAY on
// its gRPC connections: Envoy reconnects to the successor) and exit,
// without saving the state file over the successor's. Both processes hold
// the sockets throughout, so no connection is refused or waits for a
// process to start: calls with Envoy's 20 ms timeout go through. If the
// successor fails to start (a broken config, a crash, no word within
// -handover-timeout), the old process serves on as before.
//
// Socket activation: the service manager (systemd, or anything speaking
// its LISTEN_FDS protocol) binds the sockets and hands them to each
// process it starts. A restart stops the old process before the new one
// starts, and connections wait in the sockets' queues meanwhile: none is
// refused, but each waits as long as the new process takes to start
// (about 140 ms measured), longer than Envoy's timeout for a rate-limit
// call. Under systemd, a handover on a socket-activated process passes
// the same sockets on (systemctl reload with ExecReload=/bin/kill -USR2
// $MAINPID), and the old process tells systemd the successor's PID
// (sd_notify MAINPID=) before it exits.

// doors are the names a socket may carry (systemd's FileDescriptorName=):
// the listener each replaces.
var doors = []string{"listen", "admin", "forward_auth", "envoy_rls"}

// handoverEnv names the sockets a predecessor hands over, colon-separated,
// from fd 3; the fd after them is the pipe that says the successor serves.
// handoverStateEnv, if set, is the fd of the state handed over (after the
// pipe), where the predecessor had no state_file.
const (
	handoverEnv      = "SKETCHPROXY_HANDOVER"
	handoverStateEnv = "SKETCHPROXY_HANDOVER_STATE"
)

// inheritedSockets takes the listening sockets passed to this process: by
// a predecessor's handover (handoverEnv), or as systemd passes them
// (LISTEN_PID is this process, LISTEN_FDS counts them from fd 3, and
// LISTEN_FDNAMES names them, colon-separated). The variables are cleared,
// so that no child of this process takes them for its own. ready is the
// handover's pipe and state the state it hands over, if any (nil
// otherwise). None passed: an empty map.
func inheritedSockets() (socks map[string]net.Listener, ready, state *os.File, err error) {
	pid, n, names := os.Getenv("LISTEN_PID"), os.Getenv("LISTEN_FDS"), os.Getenv("LISTEN_FDNAMES")
	ho, hs := os.Getenv(handoverEnv), os.Getenv(handoverStateEnv)
	for _, v := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", handoverEnv, handoverStateEnv} {
		os.Unsetenv(v)
	}
	switch {
	case ho != "":
		nameOf := strings.Split(ho, ":")
		ready = os.NewFile(uintptr(3+len(nameOf)), "handover-ready")
		if fd, err := strconv.Atoi(hs); err == nil && fd == 4+len(nameOf) {
			state = os.NewFile(uintptr(fd), "handover-state")
		}
		if socks, err = takeSockets(nameOf); err != nil {
			ready.Close()
			if state != nil {
				state.Close()
			}
			return nil, nil, nil, fmt.Errorf("%s=%q: %v", handoverEnv, ho, err)
		}
		return socks, ready, state, nil
	case n == "" || pid != strconv.Itoa(os.Getpid()):
		return map[string]net.Listener{}, nil, nil, nil // none, or meant for another process
	}
	count, err := strconv.Atoi(n)
	if err != nil || count < 1 || count > len(doors) {
		return nil, nil, nil, fmt.Errorf("LISTEN_FDS=%q: want 1 to %d sockets, one per listener", n, len(doors))
	}
	nameOf := strings.Split(names, ":")
	if len(nameOf) != count {
		return nil, nil, nil, fmt.Errorf("LISTEN_FDNAMES=%q names %d sockets, LISTEN_FDS passes %d: name each with FileDescriptorName= (one of %s)", names, len(nameOf), count, strings.Join(doors, ", "))
	}
	socks, err = takeSockets(nameOf)
	return socks, nil, nil, err
}

// handoverState writes mw's state for a successor, where the config has no
// state_file: into a file no other process can open, made in a directory
// of its own (0700) and both removed at once, before the successor starts;
// the open file, read from its start, is handed on (handoverStateEnv).
// Without it a handover would reset every count and the warm-up.
func handoverState(mw *sketchproxy.Middleware) (*os.File, error) {
	dir, err := os.MkdirTemp("", "sketchproxy-handover-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	f, err := os.OpenFile(filepath.Join(dir, "state"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err = mw.WriteState(f); err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// restoreHandedState restores the state a predecessor handed over
// (handoverState), if any, over whatever the state file gave: it is the
// predecessor's counts of a moment ago.
func (o *options) restoreHandedState(mw *sketchproxy.Middleware) {
	if o.handedState == nil {
		return
	}
	mw.RestoreState(o.handedState, "(handed over by the predecessor)")
	o.handedState.Close()
	o.handedState = nil
}

// takeSockets takes the listening sockets at fds 3, 4, ..., named nameOf.
func takeSockets(nameOf []string) (map[string]net.Listener, error) {
	if len(nameOf) > len(doors) {
		return nil, fmt.Errorf("%d sockets: want 1 to %d, one per listener", len(nameOf), len(doors))
	}
	socks := map[string]net.Listener{}
	for i, name := range nameOf {
		fd := 3 + i
		f := os.NewFile(uintptr(fd), name)
		if !slices.Contains(doors, name) || socks[name] != nil {
			f.Close()
			for _, ln := range socks {
				ln.Close()
			}
			return nil, fmt.Errorf("inherited socket %d is named %q: name each socket after the listener it replaces with FileDescriptorName=, once each: one of %s", fd, name, strings.Join(doors, ", "))
		}
		ln, err := net.FileListener(f) // a copy: the original is closed below
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("inherited socket %d (%s): %v: want a listening TCP socket (ListenStream=)", fd, name, err)
		}
		socks[name] = ln
	}
	return socks, nil
}

// bind binds door's address, or takes the socket inherited for it. Either
// way the listener is kept, by door, for a handover.
func (o *options) bind(door, addr string) (net.Listener, error) {
	ln := o.sockets[door]
	if ln != nil {
		delete(o.sockets, door)
	} else {
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			return nil, err
		}
	}
	if o.listeners == nil {
		o.listeners = map[string]net.Listener{}
	}
	o.listeners[door] = ln
	return ln, nil
}

// unclaimedSockets is an error naming the inherited sockets no listener
// took: their connections would wait forever. After a handover they are
// only closed: the predecessor's config had the listener and this one has
// not, and once the predecessor exits the socket is gone.
func (o *options) unclaimedSockets(log *slog.Logger) error {
	if len(o.sockets) == 0 {
		return nil
	}
	var names []string
	for name, ln := range o.sockets {
		names = append(names, name)
		ln.Close()
	}
	slices.Sort(names)
	if o.ready != nil {
		log.Info("handover: the config has no listener for these sockets: closed", "sockets", strings.Join(names, ", "))
		return nil
	}
	return fmt.Errorf("inherited sockets %s: the config has no such listener (listen: with an upstream or forward_auth on it, admin: not \"off\", forward_auth.listen, envoy_rls.listen): remove the socket or configure its listener", strings.Join(names, ", "))
}

// serving tells whoever waits for this process that it serves: a
// predecessor's handover (a byte on its pipe), or systemd (sd_notify
// READY=1, for Type=notify).
func (o *options) serving(log *slog.Logger) {
	if o.ready != nil {
		// The start's garbage (the config, the state file's buffers) is
		// collected now, while the predecessor still answers every call,
		// not just after, when every gateway reconnects here at once.
		runtime.GC()
	}
	if o.procs > 0 {
		runtime.GOMAXPROCS(o.procs)
	}
	if o.ready == nil {
		if err := sdNotify("READY=1", false); err != nil {
			log.Warn("sd_notify READY=1 failed", "err", err.Error())
		}
		return
	}
	_, err := o.ready.Write([]byte{1})
	o.ready.Close()
	if err != nil {
		log.Warn("handover: the predecessor is gone", "err", err.Error())
		return
	}
	log.Info("handover: serving on the predecessor's sockets; it stops accepting now", "pid", os.Getpid())
}

// handover starts a successor on this process's listening sockets (see
// above) and reports whether it serves: then this process stops accepting,
// finishes what is in flight and exits. Otherwise (the successor failed,
// or did not say it serves within -handover-timeout, or ctx ended) the
// successor is stopped and this process serves on, saving its state file
// again.
func (o *options) handover(ctx context.Context, mw *sketchproxy.Middleware, log *slog.Logger) bool {
	names, files, err := o.listenerFiles()
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if err != nil {
		log.Error("handover refused", "err", err.Error())
		return false
	}
	exe, err := os.Executable()
	if err != nil {
		log.Error("handover refused: this binary's path is unknown", "err", err.Error())
		return false
	}
	r, w, err := os.Pipe()
	if err != nil {
		log.Error("handover refused", "err", err.Error())
		return false
	}
	defer r.Close()
	// The state file, saved now for the successor to restore, and not
	// again by this process unless the handover fails.
	resume, err := mw.HandOverState()
	if err != nil {
		w.Close()
		log.Error("handover refused: the state file was not saved for the successor", "err", err.Error())
		return false
	}
	env := append(os.Environ(), handoverEnv+"="+strings.Join(names, ":"))
	extra := append(files, w)
	if o.current.Load().StateFile == "" {
		state, err := handoverState(mw)
		if err != nil {
			w.Close()
			resume()
			log.Error("handover refused: the state could not be written for the successor", "err", err.Error())
			return false
		}
		defer state.Close()
		extra = append(extra, state)
		env = append(env, handoverStateEnv+"="+strconv.Itoa(3+len(extra)-1))
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Env = env
	cmd.ExtraFiles = extra
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	log.Info("handover: starting a successor on the listeners", "binary", exe, "sockets", strings.Join(names, ", "))
	err = cmd.Start()
	w.Close() // the successor holds it: EOF on r if it exits before a word
	if err != nil {
		resume()
		log.Error("handover failed: serving on", "err", err.Error())
		return false
	}
	return o.awaitSuccessor(ctx, cmd, r, resume, log)
}

// awaitSuccessor waits for the started successor's word that it serves on
// r; if it exits, takes longer than -handover-timeout or ctx ends first,
// it is killed and this process resumes its state saves.
func (o *options) awaitSuccessor(ctx context.Context, cmd *exec.Cmd, r *os.File, resume func(), log *slog.Logger) bool {
	ready := make(chan error, 1)
	go func() {
		var b [1]byte
		_, err := r.Read(b[:])
		ready <- err
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reaps it, whenever it ends
	t := time.NewTimer(o.handoverTimeout)
	defer t.Stop()
	fail := func(why string, args ...any) bool {
		cmd.Process.Kill()
		resume()
		log.Error("handover failed: serving on, "+why, append(args, "successor_pid", cmd.Process.Pid)...)
		return false
	}
	select {
	case err := <-ready:
		if err != nil {
			return fail("the successor exited before it served (its log says why)", "exit", fmt.Sprint(<-exited))
		}
	case err := <-exited:
		return fail("the successor exited before it served (its log says why)", "exit", fmt.Sprint(err))
	case <-t.C:
		return fail("the successor did not serve within -handover-timeout", "timeout", o.handoverTimeout.String())
	case <-ctx.Done():
		return fail("stopping instead")
	}
	// systemd's main process is now the successor: without the word, the
	// service would end with this process, and systemd would stop the
	// successor with it. The barrier waits until systemd has read it.
	if err := sdNotify("MAINPID="+strconv.Itoa(cmd.Process.Pid), true); err != nil {
		log.Warn("sd_notify MAINPID failed: under systemd, the successor may be stopped with this process", "err", err.Error())
	}
	log.Info("handover: the successor serves; stopping to accept", "successor_pid", cmd.Process.Pid)
	return true
}

// listenerFiles returns the listeners' names, sorted, and a copy of each
// one's socket, in that order, for a successor.
func (o *options) listenerFiles() (names []string, files []*os.File, err error) {
	for name := range o.listeners {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		f, err := listenerFile(o.listeners[name], name)
		if err != nil {
			return names, files, fmt.Errorf("listener %s: %w", name, err)
		}
		files = append(files, f)
	}
	return names, files, nil
}

// listenerFile is a copy of ln's socket for a successor; ln stays open.
// Not TCPListener.File: os/exec takes each file's Fd, and Fd of such a
// file puts the socket into blocking mode, which its copies share: this
// process's accept would then block in the kernel, and closing the
// listener would wait for the next connection (for ever, where the
// handover failed and none came). A file made by os.NewFile from a
// non-blocking descriptor stays non-blocking through Fd.
func listenerFile(ln net.Listener, name string) (*os.File, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("%T is not a socket", ln)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var fd uintptr
	var errno syscall.Errno
	if err := rc.Control(func(s uintptr) {
		fd, _, errno = syscall.Syscall(syscall.SYS_FCNTL, s, syscall.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, err
	}
	if errno != 0 {
		return nil, errno
	}
	return os.NewFile(fd, name), nil
}
