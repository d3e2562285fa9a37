package config

import (
	"fmt"
	"time"
)

// ServerConfig bounds what a client can hold of the proxy (cmd/sketchproxy).
type ServerConfig struct {
	// ReadHeaderTimeout is how long a client may take to send its request
	// headers, 10ms to 5m: the slowloris bound.
	ReadHeaderTimeout Duration `yaml:"read_header_timeout" reload:"restart" example:"10s"`
	// IdleTimeout closes keep-alive connections idle this long (1s or
	// more).
	IdleTimeout Duration `yaml:"idle_timeout" reload:"restart" example:"2m"`
	// MaxHeaderBytes caps a request's headers, 4096 to 16 MiB: a larger
	// request gets 431.
	MaxHeaderBytes int `yaml:"max_header_bytes" reload:"restart" example:"65536"`
	// BodyTimeout is how long a client may take to send a request body,
	// counted from the end of its headers, 10ms to 1h. A body still
	// arriving then is cut off with 408. Requests without a body, and the
	// streams of an upgraded connection, are not affected.
	BodyTimeout Duration `yaml:"body_timeout" example:"30s"`
	// BufferBody is how much of a request body is read before the upstream
	// is contacted, up to 64 MiB (0 streams bodies at once). A body that
	// fits is sent upstream whole, so a client that sends it slowly holds a
	// proxy goroutine but never an upstream connection; a larger one is
	// streamed once the buffer is full.
	BufferBody *int `yaml:"buffer_body" example:"65536"`
	// MaxInFlightPerClient caps one client address's requests in progress,
	// over all rules, including those whose body is still arriving (0: no
	// cap). Past it: 429 with Retry-After. Each address's count is exact:
	// other addresses never take its places.
	MaxInFlightPerClient *int `yaml:"max_in_flight_per_client" example:"64"`
	// UpstreamTimeout is how long the upstream may stay silent: before its
	// response's headers, and between two reads of its body, as nginx's
	// proxy_read_timeout (0, or a negative value in code: no bound; at
	// most 24h). Past it the client gets 504 (cmd/sketchproxy).
	UpstreamTimeout Duration `yaml:"upstream_timeout" reload:"restart" example:"60s"`
}

// prepare applies the server section's defaults and checks its bounds.
func (sv *ServerConfig) prepare(c *Config) error {
	if err := sv.prepareHeaders(c); err != nil {
		return err
	}
	if err := sv.prepareBody(c); err != nil {
		return err
	}
	return sv.prepareCaps(c)
}

// prepareHeaders covers the connection's bounds: the headers' time and
// size, and idle keep-alives.
func (sv *ServerConfig) prepareHeaders(c *Config) error {
	if sv.ReadHeaderTimeout == 0 {
		sv.ReadHeaderTimeout = Duration(10 * time.Second)
	}
	if sv.IdleTimeout == 0 {
		sv.IdleTimeout = Duration(2 * time.Minute)
	}
	if sv.MaxHeaderBytes == 0 {
		sv.MaxHeaderBytes = 64 << 10
	}
	if sv.ReadHeaderTimeout < Duration(10*time.Millisecond) || sv.ReadHeaderTimeout > Duration(5*time.Minute) {
		return c.errAt("want 10ms to 5m", "server", "read_header_timeout")
	}
	if sv.IdleTimeout < Duration(time.Second) {
		return c.errAt("want 1s or more", "server", "idle_timeout")
	}
	if sv.MaxHeaderBytes < 4096 || sv.MaxHeaderBytes > 16<<20 {
		return c.errAt(fmt.Sprintf("%d: want 4096 to 16 MiB", sv.MaxHeaderBytes), "server", "max_header_bytes")
	}
	return nil
}

// prepareBody covers the body's time and the upstream's silence.
func (sv *ServerConfig) prepareBody(c *Config) error {
	if sv.BodyTimeout == 0 {
		sv.BodyTimeout = Duration(30 * time.Second)
	}
	if sv.BodyTimeout < Duration(10*time.Millisecond) || sv.BodyTimeout > Duration(time.Hour) {
		return c.errAt("want 10ms to 1h", "server", "body_timeout")
	}
	if err := orNone(c, &sv.UpstreamTimeout, Duration(time.Minute), "server", "upstream_timeout"); err != nil {
		return err
	}
	if sv.UpstreamTimeout > Duration(24*time.Hour) {
		return c.errAt("want 0 (no bound) to 24h", "server", "upstream_timeout")
	}
	return nil
}

// prepareCaps covers the buffer and the per-client cap, whose 0 is a
// setting of its own (hence pointers).
func (sv *ServerConfig) prepareCaps(c *Config) error {
	if sv.BufferBody == nil {
		sv.BufferBody = ptr(64 << 10)
	}
	if *sv.BufferBody < 0 || *sv.BufferBody > 64<<20 {
		return c.errAt(fmt.Sprintf("%d: want 0 (stream at once) to 64 MiB", *sv.BufferBody), "server", "buffer_body")
	}
	if sv.MaxInFlightPerClient == nil {
		sv.MaxInFlightPerClient = ptr(64)
	}
	if *sv.MaxInFlightPerClient < 0 || *sv.MaxInFlightPerClient > 1<<20 {
		return c.errAt(fmt.Sprintf("%d: want 0 (no cap) to 2^20", *sv.MaxInFlightPerClient), "server", "max_in_flight_per_client")
	}
	return nil
}
