// Package config is SketchProxy's configuration: every section of the
// YAML file as a type, the defaults, the checks and their messages
// (Error), which settings a reload applies (RestartOnly), and Build, which
// compiles a Config into the immutable value the doors, the engine and the
// fleet run on. It knows no protocol: neither Envoy's protobufs nor a JWT
// library are among its dependencies, so that the Caddy module can use it.
//
// The configuration reference (docs/configuration.md) is generated from
// the types below by sketchproxy/internal/configref: their doc comments,
// their reload and example tags, and the defaults prepare applies.
package config
