package config

import (
	"fmt"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v4"
)

// nodePath finds the node at line and column in the document root: the
// path to it (strings are map keys, ints sequence indexes), and whether it
// is a mapping's key, in which case the path is the mapping's. The YAML
// library reports a value it cannot decode, a Duration that does not
// parse included, at the value's own line and column, and an unknown field
// at its key's.
func nodePath(root *yaml.Node, line, col int) (path []any, isKey bool) {
	if root == nil || line == 0 || len(root.Content) == 0 {
		return nil, false
	}
	var find func(n *yaml.Node, path []any) ([]any, bool, bool)
	find = func(n *yaml.Node, path []any) ([]any, bool, bool) {
		if n.Line == line && n.Column == col && n.Kind == yaml.ScalarNode {
			return path, false, true
		}
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				if k.Line == line && k.Column == col {
					return path, true, true
				}
				if p, key, ok := find(n.Content[i+1], append(path[:len(path):len(path)], k.Value)); ok {
					return p, key, true
				}
			}
		case yaml.SequenceNode:
			for i, item := range n.Content {
				if p, key, ok := find(item, append(path[:len(path):len(path)], i)); ok {
					return p, key, true
				}
			}
		}
		return nil, false, false
	}
	path, isKey, _ = find(root.Content[0], nil)
	return path, isKey
}

// unknownField says that the mapping at path, in a document of type top,
// has no field name, and what was probably meant: the known field of that
// section closest in spelling, or the section elsewhere that has a field
// of that very name.
func unknownField(top reflect.Type, path []any, name string) string {
	msg := fmt.Sprintf("unknown field %q", name)
	if len(path) > 0 {
		msg += " in " + fieldName(path...)
	}
	t := typeAt(top, path)
	if t == nil {
		return msg
	}
	if best := closest(name, yamlFields(t)); best != "" {
		return msg + fmt.Sprintf(": did you mean %s?", best)
	}
	elsewhere := sectionsWith(top, name, "")
	if word := withWord(name, yamlFields(t)); word != "" {
		// path in rules[].match is path_prefix there, whatever
		// forward_auth's own path is.
		msg += fmt.Sprintf(": did you mean %s?", word)
		if len(elsewhere) > 0 {
			msg += fmt.Sprintf(" (%s has a field %s of its own)", strings.Join(elsewhere, " and "), name)
		}
		return msg
	}
	if len(elsewhere) > 0 {
		return msg + fmt.Sprintf(": it belongs under %s", strings.Join(elsewhere, " or "))
	}
	return msg + ": the fields here are " + strings.Join(yamlFields(t), ", ")
}

// typeAt is the struct type of the mapping at path in a document of type
// top, or nil.
func typeAt(t reflect.Type, path []any) reflect.Type {
	for _, p := range path {
		t = indirect(t)
		switch k := p.(type) {
		case int:
			if t.Kind() != reflect.Slice {
				return nil
			}
			t = t.Elem()
		case string:
			if t.Kind() != reflect.Struct {
				return nil
			}
			f, ok := fieldByYAML(t, k)
			if !ok {
				return nil
			}
			t = f.Type
		}
	}
	if t = indirect(t); t.Kind() != reflect.Struct {
		return nil
	}
	return t
}

// sectionsWith lists the paths (below prefix) of the sections of t that
// have a field called name, in the file's words: client_ip, rules[].
func sectionsWith(t reflect.Type, name, prefix string) []string {
	var out []string
	for _, f := range reflect.VisibleFields(t) {
		yn := yamlName(f)
		if yn == "" || !f.IsExported() {
			continue
		}
		p := yn
		if prefix != "" {
			p = prefix + "." + yn
		}
		ft := indirect(f.Type)
		if ft.Kind() == reflect.Slice {
			ft, p = indirect(ft.Elem()), p+"[]"
		}
		if ft.Kind() != reflect.Struct || ft == t {
			continue
		}
		if _, ok := fieldByYAML(ft, name); ok {
			out = append(out, p)
		}
		out = append(out, sectionsWith(ft, name, p)...)
	}
	return out
}

// withWord is the one candidate that has name as one of its words
// (path_prefix for path, max_in_flight for in_flight), or "" if none or
// several do.
func withWord(name string, candidates []string) string {
	name = strings.ToLower(name)
	found := ""
	for _, c := range candidates {
		if c == name || !strings.Contains("_"+c+"_", "_"+name+"_") {
			continue
		}
		if found != "" {
			return ""
		}
		found = c
	}
	return found
}

// closest is the candidate within an edit distance of about a third of
// name's length (at least 1, and 2 from 6 letters on), or "": a typo,
// not another word.
func closest(name string, candidates []string) string {
	best, bestD := "", max(1, len(name)/3)+1
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(name), c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the number of edits between a and b, in bytes: a byte
// added, removed or changed, or two neighbours swapped (brust, burst).
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// yamlFields lists the names a file can give t's fields.
func yamlFields(t reflect.Type) []string {
	var names []string
	for _, f := range reflect.VisibleFields(t) {
		if n := yamlName(f); n != "" && f.IsExported() {
			names = append(names, n)
		}
	}
	return names
}

// fieldByYAML is t's field that the file names name.
func fieldByYAML(t reflect.Type, name string) (reflect.StructField, bool) {
	for _, f := range reflect.VisibleFields(t) {
		if f.IsExported() && yamlName(f) == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// indirect is t without its pointers.
func indirect(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}
