package sketchproxy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

// docSection returns the text of page's "## heading" section, up to the
// next heading of that level, with every run of white space read as one
// space, so that a claim may wrap anywhere.
func docSection(t *testing.T, page, heading string) string {
	t.Helper()
	src, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(src), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("%s has no section %q", page, heading)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	return strings.Join(strings.Fields(sec), " ")
}

// Each secret file is trimmed as docs/operations.md's "Secret files"
// table says: the row is on the page, and a file written with the bytes
// the row says are trimmed yields the secret without them.
func TestSecretFilesTrimmed(t *testing.T) {
	page := docSection(t, filepath.Join("docs", "operations.md"), "Secret files")
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const secret = "0123456789abcdef0123456789abcdef"
	built := func(yaml string) *config.Built {
		t.Helper()
		cfg, err := ParseConfig("p.yaml", []byte(yaml+"rules:\n  - limits: [{requests: 1, per: 1s}]\n"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := config.Build(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, c := range []struct {
		row, content, want string
		got                func(string) string
	}{
		{
			row:     "| `key_label_secret_file` | leading and trailing white space",
			content: " \t" + secret + " \r\n\n", want: secret,
			got: func(f string) string { return string(built("key_label_secret_file: " + f + "\n").LabelKey()) },
		},
		{
			row:     "| `jwt.hmac_secret_file` | trailing CR and LF only; every other byte, a space included, is the secret",
			content: " " + secret + " \r\n\n", want: " " + secret + " ",
			got: func(f string) string { return string(built("jwt: {hmac_secret_file: " + f + "}\n").JWT().HMACSecret()) },
		},
		{
			row:     "| `fleet.secret_file` | leading and trailing white space",
			content: "\n " + secret + "\t\r\n", want: secret,
			got: func(f string) string {
				return string(built("fleet: {redis: \"127.0.0.1:1\", secret_file: " + f + "}\n").Fleet().Secret())
			},
		},
		{
			row:     "| `fleet.password_file` | trailing CR and LF only",
			content: " pass word \r\n", want: " pass word ",
			got: func(f string) string {
				return built("fleet: {redis: \"127.0.0.1:1\", secret: " + secret + ", password_file: " + f + "}\n").Fleet().RedisOptions().Password
			},
		},
	} {
		if !strings.Contains(page, c.row) {
			t.Errorf("docs/operations.md, Secret files, has no row %q", c.row)
		}
		name := strings.Trim(strings.Fields(c.row)[1], "`")
		if got := c.got(write(name, c.content)); got != c.want {
			t.Errorf("%s holding %q: the secret is %q, want %q as the page says", name, c.content, got, c.want)
		}
	}
}
