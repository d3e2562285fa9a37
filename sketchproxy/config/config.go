package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v4"
)

// Config is SketchProxy's configuration, usually read from YAML with
// Load. Zero fields take the defaults listed in docs/configuration.md,
// which internal/configref generates from these types. Where 0 is a
// setting of its own (no warmup, no delay, no leeway), a file that writes 0
// gets 0, and code that builds a Config asks for it with a negative value:
// the zero value still means the default.
type Config struct {
	// Listen is the proxy's address: the proxy's, and the forward_auth
	// check's unless it has a listen of its own.
	Listen string `yaml:"listen" reload:"restart" example:"\":8080\""`
	// Admin is the address of /metrics and /healthz; "off" disables it.
	// Keep it off the public network.
	Admin string `yaml:"admin" reload:"restart" example:"\"127.0.0.1:9091\""`
	// Upstream is the URL requests are proxied to (cmd/sketchproxy only;
	// the middleware wraps any handler). A config with forward_auth or
	// envoy_rls may leave it out and answer a gateway only.
	Upstream string `yaml:"upstream" reload:"restart" example:"\"http://127.0.0.1:9000\""`
	// StateFile, if set, keeps the sketches across restarts: restored at
	// start (a bad file is logged and the proxy starts empty), saved every
	// StateEvery and at shutdown. It holds the hash keys: it is written
	// 0600; keep it private.
	StateFile string `yaml:"state_file" reload:"restart" example:"/var/lib/sketchproxy/state"`
	// StateEvery is how often the state file is saved (at least 1s).
	StateEvery Duration `yaml:"state_every" reload:"restart" example:"1m"`
	// KeyLabelSecretFile holds the secret that keys the hash standing for
	// keys in logs and metrics: "k:" and the first 12 hex digits of
	// HMAC-SHA256(secret, key). With it a client's label stays the same
	// across restarts and replicas, and sketchproxy -key-label computes a
	// known client's (docs/metrics.md); without it the hash is keyed at
	// random at each start. The file's surrounding whitespace is trimmed,
	// and at least 16 bytes must remain. Keep it private: with it, the
	// labels of all IPv4 addresses can be computed.
	KeyLabelSecretFile string `yaml:"key_label_secret_file" reload:"restart" example:"/etc/sketchproxy/label.key"`

	Server   ServerConfig   `yaml:"server"`
	ClientIP ClientIPConfig `yaml:"client_ip"`
	Sketch   SketchConfig   `yaml:"sketch"`
	Tarpit   TarpitConfig   `yaml:"tarpit"`
	NewKeys  NewKeysConfig  `yaml:"new_keys"`
	Headers  HeadersConfig  `yaml:"headers"`
	// JWT verifies bearer tokens for keys with a "jwt:CLAIM" part.
	JWT *JWTConfig `yaml:"jwt"`
	// Fleet shares the heavy keys' counts with other replicas through
	// Redis (nil: this proxy enforces its limits alone). A reload keeps the
	// running fleet settings (Middleware.install), and one that adds or
	// removes the section fails.
	Fleet *FleetConfig `yaml:"fleet" reload:"restart"`
	// ForwardAuth answers a gateway's decision requests (nginx
	// auth_request, Caddy forward_auth, Traefik forwardAuth) instead of, or
	// beside, proxying (nil: off).
	ForwardAuth *ForwardAuthConfig `yaml:"forward_auth"`
	// EnvoyRLS serves Envoy's rate-limit service over gRPC (nil: off).
	EnvoyRLS *EnvoyRLSConfig `yaml:"envoy_rls"`
	// Rules are the HTTP doors' rules (the proxy's and forward_auth's): a
	// request is admitted only if every rule that matches it admits it.
	Rules []Rule `yaml:"rules"`

	src  string     // file name, for messages
	root *yaml.Node // the parsed document, for line numbers
}

// Duration is a time.Duration written as "10s", "1m", "24h" or "1d".
type Duration time.Duration

// UnmarshalYAML reads a duration.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := parseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %v", n.Line, err)
	}
	*d = Duration(v)
	return nil
}

// parseDuration reads a Go duration, or a positive number of days up to
// 3650 ("1d", "0.5d").
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if strings.HasSuffix(s, "d") {
		n, err := strconv.ParseFloat(strings.TrimSuffix(s, "d"), 64)
		if err != nil || n <= 0 || n > 3650 {
			return 0, fmt.Errorf("duration %q: want e.g. 1s, 10m, 24h or 1d", s)
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("duration %q: want e.g. 1s, 10m, 24h or 1d", s)
	}
	return d, nil
}

// Error is a configuration problem, with where it is.
type Error struct {
	File  string // the file, or "" for a Config built in code
	Line  int    // 0 when unknown
	Field string // e.g. rules[1].limits[0].per
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(":")
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, "%d:", e.Line)
	}
	if b.Len() > 0 {
		b.WriteString(" ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Load reads and validates a YAML file.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the config: %w", err)
	}
	return Parse(path, b)
}

var (
	reUnknownField = regexp.MustCompile(`^field (\S+) not found in type \S+$`)
	reBadType      = regexp.MustCompile("cannot construct !!(\\w+) `([^`]*)` into (\\S+)")
	reOwnLine      = regexp.MustCompile(`^line (\d+): (.*)$`) // a Duration's own error
)

// Parse parses and validates YAML; name is used in messages. Unknown
// fields are errors (a typo must not silently disable a limit).
func Parse(name string, data []byte) (*Config, error) {
	c := &Config{src: name}
	if err := notUTF8(name, data); err != nil {
		return nil, err
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, yamlError(name, err, nil, nil, data)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(c); errors.Is(err, io.EOF) {
		return nil, &Error{File: name, Msg: "the file is empty: see sketchproxy -example"}
	} else if err != nil {
		return nil, yamlError(name, err, &root, reflect.TypeFor[Config](), data)
	}
	c.src, c.root = name, &root
	if err := c.prepare(&Built{}); err != nil { // the parsed Config is ours: defaults applied in place
		return nil, err
	}
	return c, nil
}

// yamlError turns the YAML library's errors into "file:line: field: what",
// with the line of the problem itself and, where the document root (of
// type top) was parsed, the path of the value at fault; an unknown field
// is named with the section it is in and the closest known field. data is
// the document, for a hint about the line at fault (a tab in its indent).
func yamlError(name string, err error, root *yaml.Node, top reflect.Type, data []byte) error {
	var mark yaml.Mark
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	var les *yaml.LoadErrors
	var le *yaml.LoadError
	switch {
	case errors.As(err, &les) && len(les.Errors) > 0:
		mark, msg = les.Errors[0].Mark, les.Errors[0].Message
	case errors.As(err, &le):
		mark, msg = le.Mark, le.Message
	}
	// A Duration's own error says "line N:" itself.
	if m := reOwnLine.FindStringSubmatch(msg); m != nil {
		mark.Line, _ = strconv.Atoi(m[1])
		msg = m[2]
	}
	path, isKey := nodePath(root, mark.Line, mark.Column)
	if m := reUnknownField.FindStringSubmatch(msg); m != nil && isKey {
		return &Error{File: name, Line: mark.Line, Msg: unknownField(top, path, m[1])}
	} else if m != nil {
		return &Error{File: name, Line: mark.Line, Msg: fmt.Sprintf("unknown field %q", m[1])}
	}
	msg = reBadType.ReplaceAllString(msg, "a $1 \"$2\" where a $3 belongs")
	if m := reNotMapping.FindStringSubmatch(msg); m != nil && len(path) == 0 && top != nil {
		msg = fmt.Sprintf("a %s where the file's settings belong: the top level is a mapping (listen:, upstream:, rules: ...; see sketchproxy -example)", m[1])
	}
	if !strings.Contains(msg, "tab") && tabIndented(data, mark.Line) {
		msg += " (the line is indented with a tab: YAML indents with spaces)"
	}
	return &Error{File: name, Line: mark.Line, Field: fieldName(path...), Msg: msg}
}

var reNotMapping = regexp.MustCompile(`^cannot construct !!(seq|str|int|float|bool) into \S+$`)

// tabIndented reports whether line (from 1) of data has a tab in its
// leading white space: the YAML library's message about it is often only
// "found character that cannot start any token".
func tabIndented(data []byte, line int) bool {
	if line < 1 {
		return false
	}
	lines := bytes.SplitN(data, []byte("\n"), line+1)
	if len(lines) < line {
		return false
	}
	l := lines[line-1]
	return bytes.IndexByte(l[:len(l)-len(bytes.TrimLeft(l, " \t"))], '\t') >= 0
}

// notUTF8 is the error for a document that is not UTF-8 (nor UTF-16 with
// its byte order mark, which the YAML library reads), at the first byte at
// fault: the library's own message names neither its line nor its column.
func notUTF8(name string, data []byte) error {
	if utf8.Valid(data) || bytes.HasPrefix(data, []byte{0xff, 0xfe}) || bytes.HasPrefix(data, []byte{0xfe, 0xff}) {
		return nil
	}
	at := 0
	for at < len(data) {
		r, n := utf8.DecodeRune(data[at:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		at += n
	}
	line := 1 + bytes.Count(data[:at], []byte("\n"))
	col := at - bytes.LastIndexByte(data[:at], '\n')
	return &Error{File: name, Line: line, Msg: fmt.Sprintf("byte 0x%02X at column %d is not UTF-8: save the file as UTF-8", data[at], col)}
}

// lineOf finds the line of a field by path: strings are map keys, ints
// sequence indexes. It returns the deepest line found.
func (c *Config) lineOf(path ...any) int {
	line, _ := c.walk(path...)
	return line
}

// given reports whether the parsed file writes the field at path, so that
// an explicit 0 can be told from a field left out.
func (c *Config) given(path ...any) bool {
	_, found := c.walk(path...)
	return found
}

// walk follows path through the parsed document: the deepest line reached,
// and whether the whole path is there.
func (c *Config) walk(path ...any) (line int, found bool) {
	if c.root == nil || len(c.root.Content) == 0 {
		return 0, false
	}
	n := c.root.Content[0]
	line = n.Line
	for _, p := range path {
		switch k := p.(type) {
		case string:
			if n.Kind != yaml.MappingNode {
				return line, false
			}
			found := false
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == k {
					line = n.Content[i].Line
					n = n.Content[i+1]
					found = true
					break
				}
			}
			if !found {
				return line, false
			}
		case int:
			if n.Kind != yaml.SequenceNode || k >= len(n.Content) {
				return line, false
			}
			n = n.Content[k]
			line = n.Line
		}
	}
	// "field:" with nothing after it, or null, is a field left out.
	return line, !(n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

// orNone applies the default of a field whose 0 is a choice of its own
// (none: no warmup, no delay, no leeway): a field left out (or left empty)
// takes def, an explicit 0 in the file is 0, and so is a negative value set
// in code. A negative value in the file is an error.
func orNone[T ~int | ~int64](c *Config, p *T, def T, path ...any) error {
	given := c.given(path...)
	switch {
	case *p < 0 && given:
		return c.errAt("want 0 (none) or more", path...)
	case *p < 0:
		*p = 0
	case *p == 0 && !given:
		*p = def
	}
	return nil
}

// fieldName renders a path as rules[1].limits[0].per.
func fieldName(path ...any) string {
	var b strings.Builder
	for _, p := range path {
		switch k := p.(type) {
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(k)
		case int:
			fmt.Fprintf(&b, "[%d]", k)
		}
	}
	return b.String()
}

// errAt is a Error about the field at path: its name, and its line
// in a parsed file.
func (c *Config) errAt(msg string, path ...any) error {
	return &Error{File: c.src, Line: c.lineOf(path...), Field: fieldName(path...), Msg: msg}
}

// Validate checks c as New would use it: with its defaults applied, to a
// copy (c itself is not changed). Errors name the field and, for parsed
// files, the line.
func (c *Config) Validate() error {
	_, err := Build(c)
	return err
}

// clone copies c deeply: every exported pointer, slice and map is copied,
// at every depth, so that preparing the copy (defaults are written in
// place) changes nothing of c, whatever fields a later version adds.
// Unexported fields (the parsed document, for line numbers) are shared:
// they are read only.
func (c *Config) clone() *Config {
	cp := *c
	deepen(reflect.ValueOf(&cp).Elem())
	return &cp
}

// deepen replaces the pointers, slices and maps reachable from v through
// exported fields with copies.
func deepen(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				deepen(v.Field(i))
			}
		}
	case reflect.Pointer:
		if !v.IsNil() {
			p := reflect.New(v.Type().Elem())
			p.Elem().Set(v.Elem())
			deepen(p.Elem())
			v.Set(p)
		}
	case reflect.Slice:
		if !v.IsNil() {
			s := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
			reflect.Copy(s, v)
			for i := range s.Len() {
				deepen(s.Index(i))
			}
			v.Set(s)
		}
	case reflect.Map:
		if !v.IsNil() {
			m := reflect.MakeMapWithSize(v.Type(), v.Len())
			for it := v.MapRange(); it.Next(); {
				e := reflect.New(v.Type().Elem()).Elem()
				e.Set(it.Value())
				deepen(e)
				m.SetMapIndex(it.Key(), e)
			}
			v.Set(m)
		}
	}
}

// prepare applies the defaults, the one place they are applied, and checks
// c in place: section by section, in the order of the file's reference.
func (c *Config) prepare(b *Built) error {
	if err := c.prepareTop(b); err != nil {
		return err
	}
	if err := c.Server.prepare(c); err != nil {
		return err
	}
	if err := c.ClientIP.prepare(c, &b.trusted); err != nil {
		return err
	}
	if err := c.Sketch.prepare(c); err != nil {
		return err
	}
	if err := c.Tarpit.prepare(c); err != nil {
		return err
	}
	if err := c.NewKeys.prepare(c); err != nil {
		return err
	}
	if err := c.validateFleet(&b.fleet); err != nil {
		return err
	}
	if err := c.validateForwardAuth(); err != nil {
		return err
	}
	if err := c.validateEnvoyRLS(&b.rls); err != nil {
		return err
	}
	if err := c.validateJWT(&b.jwt); err != nil {
		return err
	}
	return c.prepareRules(b)
}

// prepareTop applies the defaults of the top-level settings and checks
// them; it reads the key label secret into b.
func (c *Config) prepareTop(b *Built) error {
	orDefault(&c.Listen, ":8080")
	orDefault(&c.Admin, "127.0.0.1:9091")
	orDefault(&c.StateEvery, Duration(time.Minute))
	if err := checkAddr(c.Listen); err != nil {
		return c.errAt(err.Error(), "listen")
	}
	if c.Admin != "off" {
		if err := checkAddr(c.Admin); err != nil {
			return c.errAt(err.Error()+`, or "off"`, "admin")
		}
	}
	if c.StateEvery < Duration(time.Second) {
		return c.errAt("want 1s or more", "state_every")
	}
	if c.Upstream != "" {
		u, err := url.Parse(c.Upstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return c.errAt(fmt.Sprintf("%q: want an http:// or https:// URL with a host", c.Upstream), "upstream")
		}
	}
	if c.KeyLabelSecretFile != "" {
		raw, err := os.ReadFile(c.KeyLabelSecretFile)
		if err != nil {
			return c.errAt(err.Error(), "key_label_secret_file")
		}
		if b.labelKey = []byte(strings.TrimSpace(string(raw))); len(b.labelKey) < 16 {
			return c.errAt(fmt.Sprintf("the secret is %d bytes: use at least 16 random bytes, e.g. openssl rand -hex 32", len(b.labelKey)), "key_label_secret_file")
		}
	}
	return nil
}

// checkAddr checks a listener's address as net.Listen("tcp") reads it:
// host:port, the host empty (every interface), an IP or a name, and the
// port a number or a service name. -check finds a bad one, not the start.
func checkAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		if _, perr := net.LookupPort("tcp", port); perr != nil {
			err = perr
		}
	}
	if err != nil {
		return fmt.Errorf(`%q: want host:port, e.g. ":8080" or "127.0.0.1:9091"`, addr)
	}
	return nil
}

// orDefault sets *p to def when it is the zero value: a field left out.
func orDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

var (
	reName   = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	reHeader = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")
)

// validHeaderName reports whether s is an HTTP field name (RFC 9110's
// token), at most 128 bytes.
func validHeaderName(s string) bool { return reHeader.MatchString(s) }

// ptr returns a pointer to a copy of v: the default of a field whose 0 is
// a setting of its own.
func ptr[T any](v T) *T { return &v }

// validName reports whether s can name a rule, a limit or a budget:
// letters, digits, - and _, at most 64 bytes.
func validName(s string) bool { return reName.MatchString(s) }

// parsePrefix reads a CIDR, masked, or one address as its own prefix.
func parsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil {
		return p.Masked(), nil
	}
	if a, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil {
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	return netip.Prefix{}, fmt.Errorf("%q: want a CIDR such as 10.0.0.0/8 or an address", s)
}
