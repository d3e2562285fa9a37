package sketchproxy

// ExampleConfig is a commented configuration with every section; `sketchproxy
// -example` prints it, and a test keeps it valid.
const ExampleConfig = `# SketchProxy configuration. Every field is optional unless noted.
listen: ":8080"                    # the proxy
upstream: "http://127.0.0.1:9000"  # required by cmd/sketchproxy
admin: "127.0.0.1:9091"            # /metrics and /healthz; "off" disables
# state_file: /var/lib/sketchproxy/state   # counts survive restarts (0600: it holds hash keys)
# state_every: 1m                          # ...saved this often and at shutdown

server:
  read_header_timeout: 10s         # slowloris: headers must arrive within this
  idle_timeout: 2m
  max_header_bytes: 65536

client_ip:
  # Only connections from these read X-Forwarded-For / Forwarded, from the right.
  trusted_proxies: ["127.0.0.1/32", "10.0.0.0/8"]
  ipv6_prefix: 64                  # one client per /64
  ipv4_prefix: 32

sketch:
  buckets: 65536                   # 4 MiB per distinct tick; never grows
  two_choice: false

tarpit:                            # ladder by estimate / threshold
  delay_above: 1                   # (1, 1.5]: held up to max_delay, then proxied
  drip_above: 1.5                  # (1.5, 2]: a 429 dripped a byte at a time
  reject_above: 2                  # (2, 8]: 429 at once
  ban_above: 8                     # above: 429 + Connection: close for ban_for
  ban_for: 10m
  max_delay: 5s
  drip_interval: 500ms
  max_held: 256                    # requests held at once, all keys
  max_held_per_key: 2              # past a cap: an immediate 429

new_keys:                          # key-rotation defense
  spike_factor: 4                  # first sightings/s above 4x their average...
  min_per_second: 50               # ...and above 50/s is a spike
  budget_factor: 0.25              # keys first seen in a spike get 1/4 of each limit
  window: 1m                       # ...for about this long

headers:
  legacy: false                    # also X-RateLimit-Limit/-Remaining/-Reset

rules:
  - name: api
    match: {host: "api.example.com", path_prefix: "/v1/", methods: [GET, POST]}
    key: ["header:X-API-Key"]      # or ip, query:NAME, or several: [header:X-API-Key, ip]
    allow:
      cidrs: ["192.0.2.0/24"]      # monitoring: no sketch work
      keys: ["internal-batch"]
    tarpit: true
    limits:
      - {name: per-second, requests: 10, per: 1s, burst: 20}
      - {name: per-day, requests: 50000, per: 1d}

  - name: llm
    match: {path_prefix: "/v1/chat/"}
    key: ["header:X-API-Key"]
    limits:
      - {name: per-minute, requests: 60, per: 1m}
    budget:                        # wallet defense
      name: tokens
      units: 200000                # per key
      per: 1d
      cost: 500                    # charged up front
      reconcile_header: X-Tokens-Used   # then what the upstream says was used
      fail_open: false             # untracked wallet: 503 (the default)
    max_in_flight: 2               # streams per key

  - name: per-ip
    key: [ip]
    shadow: true                   # decide, log, count; let through
    limits:
      - {name: per-minute, requests: 600, per: 1m, burst: 100}
`

// DemoConfig is the rule cmd/sketchproxy runs with no -config, in front of
// its built-in demo upstream.
const DemoConfig = `listen: "127.0.0.1:8080"
admin: "127.0.0.1:9091"
rules:
  - name: demo
    key: [ip]
    limits:
      - {name: per-10s, requests: 5, per: 10s, burst: 5}
`
