package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"go.yaml.in/yaml/v4"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

// entry is one setting of the reference: a section (a struct, or a list
// of them) or a field the file writes a value to.
type entry struct {
	path    string // rules[].limits[].per
	section bool
	typ     string
	doc     []string // paragraphs
	def     string   // the default, as the reference prints it
	reload  string
	example string
	same    string       // a section that recurs: the path it was first described at
	goName  string       // the field's Go name, which its doc starts with
	owner   reflect.Type // the struct whose field it is, for its doc's Go names
	own     reflect.Type // a section's own struct type
}

// instance is one prepared skeleton's value at a path, and the node the
// skeleton wrote there (nil where it wrote nothing).
type instance struct {
	v reflect.Value // invalid where the skeleton has no such section
	n *yaml.Node
}

// gen walks the Config type.
type gen struct {
	docs     map[string]*typeDoc
	entries  []entry
	problems []string
	host     string                  // this machine's name, which a default must not carry
	sections map[reflect.Type]string // struct types, by the path first describing them
}

// generate returns the reference, and what is missing from the source
// (a description, an example) for it to be complete.
func generate(dir string) ([]byte, []string, error) {
	docs, err := readDocs(filepath.Join(dir, "config"))
	if err != nil {
		return nil, nil, err
	}
	sk, err := prepareSkeletons()
	if err != nil {
		return nil, nil, fmt.Errorf("preparing the skeletons: %w", err)
	}
	g := &gen{docs: docs, sections: map[reflect.Type]string{}}
	g.host, _ = os.Hostname()
	insts := make([]instance, len(sk))
	for i, p := range sk {
		insts[i] = instance{reflect.ValueOf(p.cfg).Elem(), p.doc}
	}
	top := reflect.TypeFor[config.Config]()
	g.sections[top] = ""
	g.walk(top, "", insts, "")
	return g.render(), g.problems, nil
}

// walk adds the fields of struct type t, at path, to the reference.
// restart names the enclosing section tagged to take a restart, if any.
func (g *gen) walk(t reflect.Type, path string, insts []instance, restart string) {
	td := g.docs[t.Name()]
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		p := join(path, name)
		e := entry{path: p, reload: reloadOf(f, restart), owner: t, goName: f.Name}
		if td != nil {
			e.doc = paragraphs(td.fields[f.Name])
		}
		sub := make([]instance, len(insts))
		for j, in := range insts {
			sub[j] = instance{field(in.v, i), value(in.n, name)}
		}
		base := f.Type
		for base.Kind() == reflect.Pointer {
			base = base.Elem()
		}
		list := base.Kind() == reflect.Slice && elem(base).Kind() == reflect.Struct
		if base.Kind() == reflect.Struct || list {
			g.section(e, f, base, list, sub, restart)
			continue
		}
		e.typ = typeName(f.Type)
		e.def = g.defaultOf(sub)
		e.example = f.Tag.Get("example")
		g.check(&e, f)
		g.entries = append(g.entries, e)
	}
}

// section adds a section (a struct, or with list a list of them) and its
// fields.
func (g *gen) section(e entry, f reflect.StructField, base reflect.Type, list bool, sub []instance, restart string) {
	st := base
	if list {
		st = elem(base)
		e.path += "[]"
		e.typ = "list of sections"
		for j, in := range sub {
			sub[j] = last(in)
		}
	} else {
		e.typ = "section"
	}
	e.section, e.own = true, st
	if td := g.docs[st.Name()]; td != nil && td.doc != "" {
		e.doc = append(e.doc, paragraphs(td.doc)...)
	}
	if len(e.doc) == 0 {
		g.problems = append(g.problems, fmt.Sprintf("%s (%s): no doc comment on the field or its type", e.path, st.Name()))
	}
	if first, seen := g.sections[st]; seen {
		e.same = first
		g.entries = append(g.entries, e)
		return
	}
	g.sections[st] = e.path
	g.entries = append(g.entries, e)
	if kind, _ := config.ReloadTag(f); kind != "" {
		restart = e.path
	}
	g.walk(st, e.path, sub, restart)
}

// check notes what a field lacks, and an example its type cannot take.
func (g *gen) check(e *entry, f reflect.StructField) {
	if len(e.doc) == 0 {
		g.problems = append(g.problems, fmt.Sprintf("%s: no doc comment", e.path))
	}
	if e.example == "" {
		g.problems = append(g.problems, fmt.Sprintf("%s: no example tag", e.path))
		return
	}
	v := reflect.New(f.Type)
	if err := yaml.Unmarshal([]byte(e.example), v.Interface()); err != nil {
		g.problems = append(g.problems, fmt.Sprintf("%s: the example %q is not a %s: %v", e.path, e.example, e.typ, err))
	}
}

// reloadOf says whether a change to f takes a restart.
func reloadOf(f reflect.StructField, restart string) string {
	kind, note := config.ReloadTag(f)
	switch {
	case restart != "":
		return "takes a restart, as the whole `" + restart + "` section"
	case kind == "restart" && note != "":
		return "takes a restart (" + note + ")"
	case kind == "restart":
		return "takes a restart"
	case kind == "restart-on-listen":
		return "takes a restart while the section has no `listen` of its own (" + note + ")"
	}
	return "reloads"
}

// defaultOf is the default the prepared skeletons agree on, among those
// that leave the field out: "none" when it stays empty, and words that
// send the reader to the description when the skeletons differ (the
// default follows other settings) or it names this machine.
func (g *gen) defaultOf(insts []instance) string {
	var seen []string
	for _, in := range insts {
		if !in.v.IsValid() || in.n != nil {
			continue
		}
		s := render(in.v)
		if !slices.Contains(seen, s) {
			seen = append(seen, s)
		}
	}
	switch {
	case len(seen) == 0:
		return "none"
	case len(seen) > 1:
		return "depends on other settings: see above"
	case g.host != "" && slices.Contains(strings.FieldsFunc(seen[0], notAlnum), g.host):
		return "set at start from this machine: see above"
	}
	return seen[0]
}

// render writes a prepared value as the file would write it.
func render(v reflect.Value) string {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return "none"
		}
		v = v.Elem()
	}
	if v.Type() == reflect.TypeFor[config.Duration]() {
		return "`" + duration(time.Duration(v.Int())) + "`"
	}
	switch v.Kind() {
	case reflect.String:
		if v.String() == "" {
			return "none"
		}
		return "`" + quote(v.String()) + "`"
	case reflect.Slice:
		if v.Len() == 0 {
			return "none"
		}
		var items []string
		for i := range v.Len() {
			items = append(items, quote(fmt.Sprint(v.Index(i).Interface())))
		}
		return "`[" + strings.Join(items, ", ") + "]`"
	case reflect.Float64:
		return "`" + strconv.FormatFloat(v.Float(), 'g', -1, 64) + "`"
	case reflect.Interface:
		if v.IsNil() {
			return "none"
		}
	}
	return "`" + fmt.Sprint(v.Interface()) + "`"
}

// quote writes a string as YAML does, quoted only where it must be.
func quote(s string) string {
	b, err := yaml.Marshal(s)
	if err != nil {
		return strconv.Quote(s)
	}
	return strings.TrimSpace(string(b))
}

// duration writes d as a config does: 500ms, 10s, 2m, 1h30m, 1d.
func duration(d time.Duration) string {
	if d >= 24*time.Hour && d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// typeName is a field's type in the file's words.
func typeName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeFor[config.Duration]() {
		return "duration (`500ms`, `10s`, `1m`, `24h`, `1d`)"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int64:
		return "integer"
	case reflect.Uint64:
		return "integer, 0 or more"
	case reflect.Float64:
		return "number"
	case reflect.Slice:
		return "list of " + typeName(t.Elem()) + "s"
	case reflect.Interface:
		return "any YAML value"
	}
	return t.String()
}

// field is v's i-th field, dereferenced; invalid where v is, or where the
// section is nil.
func field(v reflect.Value, i int) reflect.Value {
	if !v.IsValid() {
		return v
	}
	f := v.Field(i)
	if f.Kind() == reflect.Pointer && f.Type().Elem().Kind() == reflect.Struct {
		if f.IsNil() {
			return reflect.Value{}
		}
		return f.Elem()
	}
	return f
}

// last is a list's last element, the one the skeletons vary, and the node
// written for it.
func last(in instance) instance {
	out := instance{}
	if in.v.IsValid() && in.v.Len() > 0 {
		out.v = in.v.Index(in.v.Len() - 1)
	}
	if in.n != nil && in.n.Kind == yaml.SequenceNode && len(in.n.Content) > 0 {
		out.n = in.n.Content[len(in.n.Content)-1]
	}
	return out
}

// value is the node a mapping n holds under key, or nil.
func value(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// elem is a slice type's element, without its pointers.
func elem(t reflect.Type) reflect.Type {
	t = t.Elem()
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// join is the path of the field name in the section at path.
func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// render writes the page.
func (g *gen) render() []byte {
	var b bytes.Buffer
	b.WriteString(header)
	b.WriteString("## Contents\n\n")
	b.WriteString("- [Top level](#top-level)\n")
	for _, e := range g.entries {
		if e.section && e.same == "" {
			fmt.Fprintf(&b, "- [`%s`](#%s)\n", e.path, slug(e.path))
		}
	}
	b.WriteString("\n## Top level\n\nThe settings outside every section.\n")
	for _, e := range g.entries {
		if e.section {
			g.renderSection(&b, e)
			continue
		}
		g.renderField(&b, e)
	}
	return b.Bytes()
}

// renderSection writes a section's heading, its description and type; a
// section met before (a descriptor's descriptors) points to its first.
func (g *gen) renderSection(b *bytes.Buffer, e entry) {
	if e.same != "" {
		fmt.Fprintf(b, "\n### `%s`\n\n", e.path)
		g.paragraphs(b, e)
		fmt.Fprintf(b, "- Type: %s, with the fields of [`%s`](#%s), one level down\n", e.typ, e.same, slug(e.same))
		return
	}
	fmt.Fprintf(b, "\n## `%s`\n\n", e.path)
	g.paragraphs(b, e)
	fmt.Fprintf(b, "- Type: %s\n", e.typ)
	if e.reload != "reloads" {
		fmt.Fprintf(b, "- On reload: %s\n", e.reload)
	}
}

// renderField writes a setting's heading, description, type, default,
// reload and example.
func (g *gen) renderField(b *bytes.Buffer, e entry) {
	fmt.Fprintf(b, "\n### `%s`\n\n", e.path)
	g.paragraphs(b, e)
	fmt.Fprintf(b, "- Type: %s\n- Default: %s\n- On reload: %s\n", e.typ, e.def, e.reload)
	name := e.path[strings.LastIndex(e.path, ".")+1:]
	fmt.Fprintf(b, "- Example: `%s: %s`\n", name, e.example)
}

// paragraphs writes e's description: the Go names of its field's struct
// (and, for a section, of the section's own) as the file's.
func (g *gen) paragraphs(b *bytes.Buffer, e entry) {
	for i, p := range e.doc {
		for _, sep := range []string{" ", ": ", ", "} {
			if rest, ok := strings.CutPrefix(p, e.goName+sep); ok && i == 0 && e.goName != "" {
				p = "`" + e.path + "`" + sep + rest // JWT, TLS: the name, whatever its case
				break
			}
		}
		b.WriteString(g.words(p, e.owner, e.own))
		b.WriteString("\n\n")
	}
}

var reIdent = regexp.MustCompile(`\b[A-Z][A-Za-z0-9]*(\.[A-Z][A-Za-z0-9]*)?\b`)

// words writes a doc comment's Go names as the file's: a field of the
// structs in scope (the one declaring the field, a section's own) or one
// named as Type.Field as its path, a section's type (one named ...Config,
// or the section's own) as the section; other text is escaped for
// Markdown. Names of one word (Redis, Window, TLS) stay, except where a
// field's doc starts with its own: the comments use them as words too
// ("through Redis").
func (g *gen) words(p string, scope ...reflect.Type) string {
	p = strings.NewReplacer("*", `\*`, "<", "&lt;").Replace(p)
	return reIdent.ReplaceAllStringFunc(p, func(id string) string {
		for _, t := range scope {
			if path, ok := g.fieldPath(t, id, false); ok {
				return "`" + path + "`"
			}
		}
		if tn, fn, ok := strings.Cut(id, "."); ok {
			for t := range g.sections {
				if t.Name() == tn {
					if path, ok := g.fieldPath(t, fn, true); ok {
						return "`" + path + "`"
					}
				}
			}
			return id
		}
		for t, path := range g.sections {
			if t.Name() == id && path != "" && (strings.HasSuffix(id, "Config") || len(scope) > 1 && t == scope[1]) {
				return "`" + path + "`"
			}
		}
		return id
	})
}

// fieldPath is the path of t's field named name (its Go name), if the
// file can set it; a name of one word only where it was qualified by its
// type (Rule.Key).
func (g *gen) fieldPath(t reflect.Type, name string, qualified bool) (string, bool) {
	if t == nil || !qualified && humps(name) < 2 {
		return "", false
	}
	path, described := g.sections[t]
	f, ok := t.FieldByName(name)
	if !described || !ok || !f.IsExported() {
		return "", false
	}
	yn, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if yn == "" || yn == "-" {
		return "", false
	}
	p := join(path, yn)
	if ft := f.Type; ft.Kind() == reflect.Slice && elem(ft).Kind() == reflect.Struct {
		p += "[]"
	}
	return p, true
}

// notAlnum reports whether r separates words.
func notAlnum(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }

// humps counts the words of a CamelCase name: StateEvery has 2, Redis
// and TLS 1, JWKSRefresh 2; an acronym of five letters or more (JWKSURL)
// counts as two, for no English word is written so.
func humps(name string) int {
	if len(name) >= 5 && isUpper(name) {
		return 2
	}
	n := 0
	rs := []rune(name)
	for i, r := range rs {
		if unicode.IsUpper(r) && (i == 0 || unicode.IsLower(rs[i-1]) || i+1 < len(rs) && unicode.IsLower(rs[i+1])) {
			n++
		}
	}
	return n
}

// slug is GitHub's anchor for a heading, as links_test.go (the repository
// root) computes it: lower case, punctuation dropped, spaces as hyphens.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

const header = `# SketchProxy configuration reference

<!-- Generated by internal/configref from the Config types: edit their doc
comments and tags, then run go generate ./... in sketchproxy/. -->

Every setting of SketchProxy's YAML file, section by section: its type,
its default (as the defaulting code applies it to a file that leaves the
setting out), whether a change applies on a reload (` + "`SIGHUP`" + `) or
takes a restart, and an example. ` + "`sketchproxy -example`" + ` prints a
commented file with every section, and ` + "`sketchproxy -config FILE -check`" + `
validates one. A setting left out, or written empty, takes its default; a
section left out is off, unless it has defaults of its own.

`

// isUpper reports whether s has no lower-case letter.
func isUpper(s string) bool {
	for _, r := range s {
		if unicode.IsLower(r) {
			return false
		}
	}
	return true
}
