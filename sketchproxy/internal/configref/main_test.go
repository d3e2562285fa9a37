package main

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

// page is the committed reference, from this directory.
const page = "../../docs/configuration.md"

// TestReferenceUpToDate regenerates the configuration reference and
// demands the committed bytes, as the simulator's TestWasmUpToDate does for
// its build: a field, a doc comment, a tag or a default changed without
// go generate fails here. The generator's own complaints (a field without
// a description or an example, an example its type cannot take) fail it
// too.
func TestReferenceUpToDate(t *testing.T) {
	got, problems, err := generate("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s", p)
	}
	want, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("sketchproxy/docs/configuration.md is stale: run go generate ./... in sketchproxy/ and commit it")
	}
}

// Every setting a file can write has its heading in the committed page,
// found by a walk of the Config type of its own: a new field fails here by
// its path, whatever the generator does.
func TestReferenceHasEveryField(t *testing.T) {
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	var paths []string
	var walk func(t reflect.Type, prefix string, depth int)
	walk = func(tp reflect.Type, prefix string, depth int) {
		for i := range tp.NumField() {
			f := tp.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if !f.IsExported() || name == "" || name == "-" {
				continue
			}
			p := name
			if prefix != "" {
				p = prefix + "." + name
			}
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
				ft, p = ft.Elem(), p+"[]"
			}
			paths = append(paths, p)
			if ft.Kind() == reflect.Struct && depth < 4 && ft != tp {
				walk(ft, p, depth+1)
			}
		}
	}
	walk(reflect.TypeFor[config.Config](), "", 0)
	if len(paths) < 120 {
		t.Fatalf("%d settings found: the walk no longer reads the Config type", len(paths))
	}
	for _, p := range paths {
		if !strings.Contains(text, "`"+p+"`\n") {
			t.Errorf("%s: not in sketchproxy/docs/configuration.md", p)
		}
	}
}

// A default that other settings decide, or that names this machine, is
// not printed as if fixed.
func TestReferenceDefaults(t *testing.T) {
	got, _, err := generate("../..")
	if err != nil {
		t.Fatal(err)
	}
	text := string(got)
	for path, want := range map[string]string{
		"server.read_header_timeout": "- Default: `10s`\n",
		"tarpit.drip_above":          "- Default: `1.5`\n",
		"client_ip.source":           "- Default: `x-forwarded-for`\n",
		"rules[].key":                "- Default: `[ip]`\n",
		"rules[].name":               "- Default: depends on other settings",
		"rules[].refused":            "- Default: depends on other settings",
		"rules[].max_in_flight":      "- Default: depends on other settings",
		"rules[].limits[].burst":     "- Default: depends on other settings",
		"rules[].budget.reserve":     "- Default: depends on other settings",
		"jwt.algorithms":             "- Default: depends on other settings",
		"fleet.id":                   "- Default: set at start from this machine",
		"listen":                     "- On reload: takes a restart\n",
		"forward_auth.path":          "- On reload: takes a restart while the section has no `listen` of its own",
		"fleet.interval":             "- On reload: takes a restart, as the whole `fleet` section",
		"server.body_timeout":        "- On reload: reloads\n",
	} {
		_, entry, ok := strings.Cut(text, "\n### `"+path+"`\n")
		if !ok {
			t.Errorf("%s: no entry", path)
			continue
		}
		entry, _, _ = strings.Cut(entry, "\n### ")
		if !strings.Contains(entry, want) {
			t.Errorf("%s: want %q in\n%s", path, want, entry)
		}
	}
}
