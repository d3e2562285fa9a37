package main

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Restarts without a gap: systemd socket activation. The service manager
// (systemd, or anything speaking its LISTEN_FDS protocol) binds the
// listening sockets and hands them to each process it starts. When the old
// process stops it closes only its own copies: the sockets stay open in
// the manager, connections that arrive meanwhile wait in their queue, and
// the new process accepts them, so no client is refused while SketchProxy
// restarts. The old process saves the state file as it stops and the new
// one restores it as it starts: counts carry over. sketchproxy/docs/operations.md
// ("Restarts without a gap") has the units.

// doors are the names a socket may carry (systemd's FileDescriptorName=):
// the listener each replaces.
var doors = []string{"listen", "admin", "forward_auth", "envoy_rls"}

// inheritedSockets takes the listening sockets passed as systemd passes
// them: LISTEN_PID is this process, LISTEN_FDS counts them from fd 3, and
// LISTEN_FDNAMES names them, colon-separated. The variables are cleared,
// so that no child of this process takes them for its own. None passed:
// an empty map.
func inheritedSockets() (map[string]net.Listener, error) {
	pid, n, names := os.Getenv("LISTEN_PID"), os.Getenv("LISTEN_FDS"), os.Getenv("LISTEN_FDNAMES")
	os.Unsetenv("LISTEN_PID")
	os.Unsetenv("LISTEN_FDS")
	os.Unsetenv("LISTEN_FDNAMES")
	socks := map[string]net.Listener{}
	if n == "" || pid != strconv.Itoa(os.Getpid()) {
		return socks, nil // none, or meant for another process
	}
	count, err := strconv.Atoi(n)
	if err != nil || count < 1 || count > len(doors) {
		return nil, fmt.Errorf("LISTEN_FDS=%q: want 1 to %d sockets, one per listener", n, len(doors))
	}
	nameOf := strings.Split(names, ":")
	if len(nameOf) != count {
		return nil, fmt.Errorf("LISTEN_FDNAMES=%q names %d sockets, LISTEN_FDS passes %d: name each with FileDescriptorName= (one of %s)", names, len(nameOf), count, strings.Join(doors, ", "))
	}
	for i := range count {
		fd := 3 + i
		f := os.NewFile(uintptr(fd), nameOf[i])
		if !slices.Contains(doors, nameOf[i]) || socks[nameOf[i]] != nil {
			f.Close()
			return nil, fmt.Errorf("inherited socket %d is named %q: name each socket after the listener it replaces with FileDescriptorName=, once each: one of %s", fd, nameOf[i], strings.Join(doors, ", "))
		}
		ln, err := net.FileListener(f) // a copy: the original is closed below
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("inherited socket %d (%s): %v: want a listening TCP socket (ListenStream=)", fd, nameOf[i], err)
		}
		socks[nameOf[i]] = ln
	}
	return socks, nil
}

// bind binds door's address, or takes the socket inherited for it.
func (o *options) bind(door, addr string) (net.Listener, error) {
	if ln := o.sockets[door]; ln != nil {
		delete(o.sockets, door)
		return ln, nil
	}
	return net.Listen("tcp", addr)
}

// unclaimedSockets is an error naming the inherited sockets no listener
// took: their connections would wait forever.
func (o *options) unclaimedSockets() error {
	if len(o.sockets) == 0 {
		return nil
	}
	var names []string
	for name, ln := range o.sockets {
		names = append(names, name)
		ln.Close()
	}
	slices.Sort(names)
	return fmt.Errorf("inherited sockets %s: the config has no such listener (listen: with an upstream or forward_auth on it, admin: not \"off\", forward_auth.listen, envoy_rls.listen): remove the socket or configure its listener", strings.Join(names, ", "))
}
