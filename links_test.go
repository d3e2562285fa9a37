package epochsketch_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// Every relative link in the repository's Markdown names a file that
// exists, and every #fragment a heading of its target, so that moving a
// section to docs/ cannot leave a dead link behind.
func TestMarkdownLinks(t *testing.T) {
	link := regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)\)`)
	headings := map[string]map[string]bool{}
	anchors := func(path string) map[string]bool {
		if a, ok := headings[path]; ok {
			return a
		}
		a := map[string]bool{}
		src, _ := os.ReadFile(path)
		fenced := false
		for _, line := range strings.Split(string(src), "\n") {
			if strings.HasPrefix(line, "```") {
				fenced = !fenced
			}
			if !fenced && strings.HasPrefix(line, "#") {
				a[slug(strings.TrimLeft(line, "# "))] = true
			}
		}
		headings[path] = a
		return a
	}
	n := 0
	filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".md") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fenced := false
		for i, line := range strings.Split(string(src), "\n") {
			if strings.HasPrefix(line, "```") {
				fenced = !fenced
			}
			if fenced {
				continue
			}
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				n++
				file, frag, _ := strings.Cut(target, "#")
				dest := path
				if file != "" {
					dest = filepath.Join(filepath.Dir(path), file)
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d: link to %s: no such file", path, i+1, target)
						continue
					}
				}
				if frag != "" && strings.HasSuffix(dest, ".md") && !anchors(dest)[frag] {
					t.Errorf("%s:%d: link to %s: %s has no heading #%s", path, i+1, target, dest, frag)
				}
			}
		}
		return nil
	})
	if n < 10 {
		t.Fatalf("checked %d links: the pattern no longer finds them", n)
	}
}

// slug is GitHub's anchor for a heading: lower case, punctuation dropped,
// spaces as hyphens.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
