package httpnorm

import (
	"net/netip"
	"strconv"
	"strings"
)

// Hosts: a rule's host is matched against one canonical spelling of the
// request's Host, the one the upstream is then sent. A name is lower-cased
// and loses one trailing dot; an IPv6 address is written in its bracketed
// compressed form; one port may follow, written without leading zeros, and
// is ignored by the match. A
// Host that is none of these (a second port, "api.example.com:80:80", an
// empty label, a byte outside letters, digits, '-', '_' and '.') is refused
// with 400, because gateways and upstreams disagree on what it names.

// CanonicalHost returns h's canonical spelling and its name without the
// port, or ok false when h is not a valid Host. An empty h is valid: an
// HTTP/1.0 request may leave Host out.
func CanonicalHost(h string) (canon, name string, ok bool) {
	if h == "" {
		return "", "", true
	}
	if len(h) > 255+6 {
		return "", "", false
	}
	var port string
	if h[0] == '[' {
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return "", "", false
		}
		a, err := netip.ParseAddr(h[1:end])
		if err != nil || !a.Is6() || a.Zone() != "" {
			return "", "", false
		}
		name = "[" + a.String() + "]"
		rest := h[end+1:]
		if rest != "" {
			if rest[0] != ':' {
				return "", "", false
			}
			port = rest[1:]
		}
	} else {
		name = h
		if i := strings.IndexByte(h, ':'); i >= 0 {
			name, port = h[:i], h[i+1:]
		}
		name = strings.TrimSuffix(name, ".")
		if !validHostName(name) {
			return "", "", false
		}
		name = strings.ToLower(name)
	}
	if !validPort(port) {
		return "", "", false
	}
	if port != "" && (port[0] != '0' || port == "0") && len(h) == len(name)+1+len(port) && h[:len(name)] == name {
		return h, name, true // canonical already: no new string
	}
	canon = name
	if port != "" {
		n, _ := strconv.Atoi(port)
		canon += ":" + strconv.Itoa(n) // 0080 is 80
	}
	return canon, name, true
}

// validHostName reports whether s is a DNS name (or an IPv4 address):
// non-empty labels of letters, digits, '-' and '_'.
func validHostName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	label := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '.':
			if label == 0 {
				return false
			}
			label = 0
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
			label++
			if label > 63 {
				return false
			}
		default:
			return false
		}
	}
	return label > 0
}

// validPort reports whether p is empty (no port, or "host:") or a port
// number up to 65535.
func validPort(p string) bool {
	if len(p) > 5 {
		return false
	}
	n := 0
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
		n = n*10 + int(p[i]-'0')
	}
	return n <= 65535
}
