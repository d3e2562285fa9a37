package sketchproxy

import "testing"

// FoldPath is what the proxy's rules match besides the path itself: the
// cleaned path, folded.
func TestFoldPath(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"/api/x", "/api/x"},
		{"/api;a=1/x", "/api/x"},
		{"/api./x", "/api/x"},
		{"/api::$DATA/x", "/api/x"},
		{"/api%20/x", "/api%20/x"}, // decoded paths only: an escape is a name
		{"/api /x", "/api/x"},
		{"//api/./b/../x", "/api/x"},
		{"/a/b;c/../d/", "/a/d/"},
		{"/x/..;/api", "/api"}, // Tomcat's "..": the proxy answers it with 400 first; a matcher folds it
		{"*", "*"},
		{"", ""},
	} {
		if got := FoldPath(c.in); got != c.want {
			t.Errorf("FoldPath(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
