// Command caddy is Caddy with the epochsketch handler module, built as
// xcaddy would build it: Caddy's command, its standard modules and ours.
//
//	cd sketchproxy/caddy && go build -o caddy ./cmd/caddy
//	./caddy list-modules | grep epochsketch
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/epochsketch/epochsketch/sketchproxy/caddy"
)

func main() {
	caddycmd.Main()
}
