package config

import (
	"reflect"
	"strings"
)

// The reload tag marks, where a field is declared, the settings that a
// reload cannot apply: cmd/sketchproxy makes its listeners, its servers'
// bounds and the upstream's transport once, at the start. RestartOnly reads
// it, and so does the configuration reference (internal/configref).
//
//	reload:"restart"                 a change takes a restart
//	reload:"restart; NOTE"           the same, reported with "(NOTE)"
//	reload:"restart-on-listen; NOTE" the running value, while its section
//	                                 has no listen of its own, stays served
//	                                 on the main listener until a restart
//
// A tag on a struct field (or a pointer to one) covers the whole section:
// any change in it is one setting that takes a restart.
const (
	reloadTag           = "reload"
	reloadRestart       = "restart"
	reloadRestartOnMain = "restart-on-listen"
	reloadSectionListen = "listen"
)

// RestartOnly lists the settings, by their path in the file, that differ
// between the running config and next and that only a restart applies (the
// fields tagged reload:"restart"): the reload keeps their running values.
// Both configs are as Load returns them, with their defaults.
func RestartOnly(running, next *Config) []string {
	var stay []string
	restartWalk(reflect.ValueOf(running).Elem(), reflect.ValueOf(next).Elem(), "", &stay)
	return stay
}

// ReloadTag reads a field's reload tag: its kind ("" for a field a reload
// applies, "restart" or "restart-on-listen") and its note.
func ReloadTag(f reflect.StructField) (kind, note string) {
	kind, note, _ = strings.Cut(f.Tag.Get(reloadTag), ";")
	return strings.TrimSpace(kind), strings.TrimSpace(note)
}

// restartWalk compares the sections a and b, of one struct type, field by
// field, descending into sections that are not tagged themselves.
func restartWalk(a, b reflect.Value, prefix string, stay *[]string) {
	t := a.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name := yamlName(f)
		if !f.IsExported() || name == "" {
			continue
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		if note := ""; restartChanged(a, b, f, &note) {
			if note != "" {
				path += " (" + note + ")"
			}
			*stay = append(*stay, path)
			continue
		}
		if kind, _ := ReloadTag(f); kind != "" {
			continue
		}
		if sa, sb, ok := sections(a.Field(i), b.Field(i)); ok {
			restartWalk(sa, sb, path, stay)
		}
	}
}

// restartChanged reports whether the field f of the sections a and b is
// tagged to take a restart and differs, with the tag's note.
func restartChanged(a, b reflect.Value, f reflect.StructField, note *string) bool {
	kind, n := ReloadTag(f)
	*note = n
	va, vb := orZero(a.FieldByIndex(f.Index)), orZero(b.FieldByIndex(f.Index))
	switch kind {
	case reloadRestart:
		return !reflect.DeepEqual(va.Interface(), vb.Interface())
	case reloadRestartOnMain:
		va, vb = onMain(a, va), onMain(b, vb)
		return !va.IsZero() && !reflect.DeepEqual(va.Interface(), vb.Interface())
	}
	return false
}

// onMain is v, a field of section s, while s has no listen of its own;
// the zero value otherwise.
func onMain(s, v reflect.Value) reflect.Value {
	for i := range s.NumField() {
		if yamlName(s.Type().Field(i)) == reloadSectionListen && !s.Field(i).IsZero() {
			return reflect.Zero(v.Type())
		}
	}
	return v
}

// sections returns a and b as structs to compare field by field: a nil
// section compares as an empty one, as it reads in a file left without it.
func sections(a, b reflect.Value) (sa, sb reflect.Value, ok bool) {
	sa, sb = orZero(a), orZero(b)
	return sa, sb, sa.Kind() == reflect.Struct
}

// orZero dereferences a pointer, a nil one to its element's zero value.
func orZero(v reflect.Value) reflect.Value {
	if v.Kind() != reflect.Pointer {
		return v
	}
	if v.IsNil() {
		return reflect.Zero(v.Type().Elem())
	}
	return v.Elem()
}

// yamlName is a field's name in the file: its yaml tag's, "" for a field
// the file cannot set.
func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" {
		return ""
	}
	return name
}
