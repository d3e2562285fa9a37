package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// record is what a parsed line yields: the key to observe and, when the
// format carries one, the record's own time.
type record struct {
	key  []byte
	when time.Time // zero: use the clock
}

// parser turns one line into a record. A malformed line returns an error that
// says what is wrong with it.
type parser func(line []byte) (record, error)

var errEmpty = errors.New("empty line")

// clfTime is the Common Log Format's time layout.
const clfTime = "02/Jan/2006:15:04:05 -0700"

// newParser returns the parser for format with the key, field and time
// options.
func newParser(format, key, field, timeField, timeFormat string) (parser, error) {
	switch format {
	case "lines":
		return func(line []byte) (record, error) {
			k := bytes.TrimSpace(line)
			if len(k) == 0 {
				return record{}, errEmpty
			}
			return record{key: k}, nil
		}, nil
	case "clf", "combined":
		pick, err := logKey(key)
		if err != nil {
			return nil, err
		}
		if key == "ua" && format == "clf" {
			return nil, usageErr("-key ua needs -format combined: the Common Log Format has no user agent")
		}
		layout := clfTime
		if timeFormat != "" {
			layout = timeFormat
		}
		return func(line []byte) (record, error) {
			if len(bytes.TrimSpace(line)) == 0 {
				return record{}, errEmpty
			}
			e, err := parseAccessLog(string(line), format == "combined", layout)
			if err != nil {
				return record{}, err
			}
			k := pick(e)
			if k == "" {
				return record{}, fmt.Errorf("the %s field is empty", key)
			}
			return record{key: []byte(k), when: e.when}, nil
		}, nil
	case "json":
		if field == "" {
			return nil, usageErr("-format json needs -field (the key's path, e.g. -field user.id)")
		}
		path := strings.Split(field, ".")
		var tpath []string
		if timeField != "" {
			tpath = strings.Split(timeField, ".")
		}
		return func(line []byte) (record, error) {
			if len(bytes.TrimSpace(line)) == 0 {
				return record{}, errEmpty
			}
			var v any
			if err := json.Unmarshal(line, &v); err != nil {
				return record{}, fmt.Errorf("not JSON: %v", err)
			}
			k, ok := lookup(v, path)
			if !ok || k == "" {
				return record{}, fmt.Errorf("no field %q", field)
			}
			r := record{key: []byte(k)}
			if tpath != nil {
				ts, ok := lookup(v, tpath)
				if !ok {
					return record{}, fmt.Errorf("no time field %q", timeField)
				}
				t, err := parseTime(ts, timeFormat)
				if err != nil {
					return record{}, fmt.Errorf("time field %q: %v", timeField, err)
				}
				r.when = t
			}
			return r, nil
		}, nil
	}
	return nil, usageErr("-format %q: unknown format (supported: lines, clf, combined, json)", format)
}

// lookup follows a dotted path through decoded JSON and renders a scalar.
func lookup(v any, path []string) (string, bool) {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return "", false
		}
		if v, ok = m[p]; !ok {
			return "", false
		}
	}
	switch x := v.(type) {
	case string:
		return x, true
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), true
	case bool:
		return strconv.FormatBool(x), true
	}
	return "", false
}

// parseTime reads a record's time: with a layout (-time-format, a Go
// layout; UTC when it has no zone), by it; else RFC 3339, or a Unix time
// whose unit its magnitude tells: seconds below 1e11 (before the year
// 5138), milliseconds below 1e14, microseconds below 1e17, else
// nanoseconds.
func parseTime(s, layout string) (time.Time, error) {
	if layout != "" {
		t, err := time.Parse(layout, s)
		if err != nil {
			return time.Time{}, fmt.Errorf("%q does not match -time-format %q", s, layout)
		}
		return t, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
		a := math.Abs(f)
		switch {
		case a < 1e11:
		case a < 1e14:
			f /= 1e3
		case a < 1e17:
			f /= 1e6
		default:
			f /= 1e9
		}
		sec := math.Floor(f)
		return time.Unix(int64(sec), int64((f-sec)*1e9)), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither RFC 3339 nor a Unix time (seconds, ms, µs or ns): give -time-format", s)
}

// accessEntry is one Common or Combined Log Format line.
type accessEntry struct {
	ip, method, uri, agent string
	when                   time.Time
}

// path is the request's path without its query string.
func (e *accessEntry) path() string {
	if i := strings.IndexByte(e.uri, '?'); i >= 0 {
		return e.uri[:i]
	}
	return e.uri
}

// logFields splits an access log line into its fields: bare words,
// [bracketed] times and "quoted" strings, whose backslash escapes (\" for a
// quote inside a user agent) are undone.
func logFields(line string) ([]string, error) {
	var out []string
	for i := 0; i < len(line); {
		switch c := line[i]; {
		case c == ' ' || c == '\t':
			i++
		case c == '[':
			j := strings.IndexByte(line[i:], ']')
			if j < 0 {
				return nil, errors.New("an unterminated [time] field")
			}
			out = append(out, line[i+1:i+j])
			i += j + 1
		case c == '"':
			var b strings.Builder
			j := i + 1
			for ; j < len(line) && line[j] != '"'; j++ {
				if line[j] == '\\' && j+1 < len(line) {
					j++
				}
				b.WriteByte(line[j])
			}
			if j >= len(line) {
				return nil, errors.New("an unterminated quoted field")
			}
			out = append(out, b.String())
			i = j + 1
		default:
			j := strings.IndexAny(line[i:], " \t")
			if j < 0 {
				j = len(line) - i
			}
			out = append(out, line[i:i+j])
			i += j
		}
	}
	return out, nil
}

// parseAccessLog parses
//
//	host ident user [02/Dec/2026:10:00:00 +0000] "GET /path HTTP/1.1" status bytes ["referer" "agent" [more fields]]
//
// by fields, so a user agent is the ninth field whatever follows it (nginx
// logs often append X-Forwarded-For), and a quote escaped inside it does not
// cut it. layout reads the time (the Common Log Format's by default).
func parseAccessLog(line string, combined bool, layout string) (accessEntry, error) {
	var e accessEntry
	f, err := logFields(line)
	if err != nil {
		return e, err
	}
	if len(f) < 7 {
		return e, fmt.Errorf("%d fields, want at least 7 (host ident user [time] \"request\" status bytes)", len(f))
	}
	e.ip = f[0]
	t, err := time.Parse(layout, f[3])
	if err != nil {
		return e, fmt.Errorf("bad time %q: want %s, or give -time-format", f[3], layout)
	}
	e.when = t
	req := strings.Fields(f[4])
	if len(req) < 2 {
		return e, fmt.Errorf("bad request %q", f[4])
	}
	e.method, e.uri = req[0], req[1]
	if combined {
		if len(f) < 9 {
			return e, errors.New("no referer and user agent (not Combined Log Format)")
		}
		e.agent = f[8]
	}
	return e, nil
}

// logKey returns the key extractor named by -key.
func logKey(name string) (func(accessEntry) string, error) {
	switch name {
	case "ip":
		return func(e accessEntry) string { return e.ip }, nil
	case "path":
		return func(e accessEntry) string { return e.path() }, nil
	case "uri":
		return func(e accessEntry) string { return e.uri }, nil
	case "method+path":
		return func(e accessEntry) string { return e.method + " " + e.path() }, nil
	case "ua":
		return func(e accessEntry) string { return e.agent }, nil
	case "ip+path":
		return func(e accessEntry) string { return e.ip + " " + e.path() }, nil
	}
	return nil, usageErr("-key %q: want ip, path (without the query), uri (with it), method+path, ua or ip+path", name)
}
