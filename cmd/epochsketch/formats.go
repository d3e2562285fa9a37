package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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

// newParser returns the parser for format with the key and field options.
func newParser(format, key, field, timeField string) (parser, error) {
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
		return func(line []byte) (record, error) {
			e, err := parseAccessLog(string(line), format == "combined")
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
				t, err := parseTime(ts)
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

// parseTime accepts RFC 3339 or Unix seconds (with a fraction).
func parseTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		sec := int64(f)
		return time.Unix(sec, int64((f-float64(sec))*1e9)), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither RFC 3339 nor Unix seconds", s)
}

// accessEntry is one Common or Combined Log Format line.
type accessEntry struct {
	ip, method, path, agent string
	when                    time.Time
}

// parseAccessLog parses
//
//	host ident user [02/Dec/2026:10:00:00 +0000] "GET /path HTTP/1.1" status bytes ["referer" "agent"]
func parseAccessLog(line string, combined bool) (accessEntry, error) {
	var e accessEntry
	sp := strings.IndexByte(line, ' ')
	if sp <= 0 {
		return e, errors.New("no client address")
	}
	e.ip = line[:sp]
	lb := strings.IndexByte(line, '[')
	rb := strings.IndexByte(line, ']')
	if lb < 0 || rb < lb {
		return e, errors.New("no [time] field")
	}
	t, err := time.Parse("02/Jan/2006:15:04:05 -0700", line[lb+1:rb])
	if err != nil {
		return e, fmt.Errorf("bad time %q", line[lb+1:rb])
	}
	e.when = t
	rest := line[rb+1:]
	q1 := strings.IndexByte(rest, '"')
	if q1 < 0 {
		return e, errors.New("no quoted request")
	}
	q2 := strings.IndexByte(rest[q1+1:], '"')
	if q2 < 0 {
		return e, errors.New("unterminated request")
	}
	req := strings.Fields(rest[q1+1 : q1+1+q2])
	if len(req) < 2 {
		return e, fmt.Errorf("bad request %q", rest[q1+1:q1+1+q2])
	}
	e.method, e.path = req[0], req[1]
	if combined {
		// The last quoted field is the user agent.
		tail := rest[q1+1+q2+1:]
		end := strings.LastIndexByte(tail, '"')
		if end < 0 {
			return e, errors.New("no user agent (not Combined Log Format)")
		}
		start := strings.LastIndexByte(tail[:end], '"')
		if start < 0 {
			return e, errors.New("no user agent (not Combined Log Format)")
		}
		e.agent = tail[start+1 : end]
	}
	return e, nil
}

// logKey returns the key extractor named by -key.
func logKey(name string) (func(accessEntry) string, error) {
	switch name {
	case "ip":
		return func(e accessEntry) string { return e.ip }, nil
	case "path":
		return func(e accessEntry) string { return e.path }, nil
	case "method+path":
		return func(e accessEntry) string { return e.method + " " + e.path }, nil
	case "ua":
		return func(e accessEntry) string { return e.agent }, nil
	case "ip+path":
		return func(e accessEntry) string { return e.ip + " " + e.path }, nil
	}
	return nil, usageErr("-key %q: want ip, path, method+path, ua or ip+path", name)
}
