package rls

import (
	"os/exec"
	"strings"
	"testing"
)

// The service is a door beside the others: it reaches the running
// configuration through its Host, never the root package, and links no
// other door's protocol (the JWT libraries are internal/jwtauth's; config
// parses JWT key files and Redis addresses itself).
func TestServiceImportsNoOtherDoor(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	banned := []string{"github.com/epochsketch/epochsketch/sketchproxy\n", "github.com/epochsketch/epochsketch/sketchproxy/internal/jwtauth\n",
		"github.com/golang-jwt/", "github.com/MicahParks/keyfunc"}
	for _, p := range strings.Fields(string(out)) {
		for _, b := range banned {
			if strings.HasPrefix(p+"\n", b) {
				t.Errorf("internal/rls depends on %s", p)
			}
		}
	}
}
