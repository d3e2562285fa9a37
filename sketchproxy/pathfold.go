package sketchproxy

import "github.com/epochsketch/epochsketch/sketchproxy/internal/httpnorm"

// FoldPath is a request path as SketchProxy's path rules also read it:
// cleaned (repeated slashes merged, "." and ".." resolved, a trailing slash
// kept) and folded as the most forgiving upstream reads it (each segment's
// ";" parameters and ":" stream name cut, then its trailing dots and
// spaces), as httpnorm.LoosePath does for the proxy's own rules. A door
// that matches paths with rules of its own (the Caddy module's path
// matcher, sketchproxy/caddy) matches both p and FoldPath(p), so that
// "/api;a=1/x" and "/api./x", which Tomcat, Jetty and IIS serve as
// /api/x, do not slip past a rule for /api/. p is a decoded path; one that
// does not start with "/" is returned as it is.
func FoldPath(p string) string { return httpnorm.LoosePath(httpnorm.CleanPath(p)) }
