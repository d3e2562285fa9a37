package config

// ExampleConfig is a commented configuration with every section; `sketchproxy
// -example` prints it, and a test keeps it valid.
const ExampleConfig = `# SketchProxy configuration. Every field is optional unless noted.
# A tour of every section, not a deployment: the per-ip rule is in shadow
# mode and the api rule matches one host. sketchproxy -example minimal
# prints a config to start from.
listen: ":8080"                    # the proxy
upstream: "http://127.0.0.1:9000"  # required by cmd/sketchproxy, unless forward_auth or envoy_rls answer a gateway alone
admin: "127.0.0.1:9091"            # /metrics and /healthz; "off" disables
# state_file: /var/lib/sketchproxy/state   # counts survive restarts (0600: it holds hash keys)
# state_every: 1m                          # ...saved this often and at shutdown
# key_label_secret_file: /etc/sketchproxy/label.key   # k:… labels of keys in logs and metrics that survive restarts

server:
  read_header_timeout: 10s         # slowloris: headers must arrive within this
  idle_timeout: 2m
  max_header_bytes: 65536
  body_timeout: 30s                # a request body must arrive within this: else 408
  buffer_body: 65536               # bodies up to this are read whole before the upstream is asked
  max_in_flight_per_client: 64     # requests in progress per client address: past it 429
  upstream_timeout: 60s            # the upstream's longest silence (headers, then between reads): else 504

client_ip:
  # Only connections from these proxies are believed, and only in source, read
  # from the right past trusted hops. Every other forwarding header is ignored.
  trusted_proxies: ["127.0.0.1/32", "10.0.0.0/8"]
  source: x-forwarded-for          # or forwarded, x-real-ip, header:CF-Connecting-IP
  set_header: X-Real-IP            # tell the upstream the client address found
  ipv6_prefix: 64                  # one client per /64
  ipv4_prefix: 32

# forward_auth:                    # a decision endpoint for nginx auth_request, Caddy forward_auth, Traefik ForwardAuth
#   path: /check                   # proxies nothing: 200 to allow, else the refusal with Retry-After and RateLimit
#   listen: "127.0.0.1:8081"       # its own address; empty: on listen, where path is never proxied
#   refusal_status: 429            # 403 for nginx (auth_request passes only 2xx, 401, 403)
#                                  # only callers in client_ip.trusted_proxies are answered

# envoy_rls:                       # Envoy's and Istio's rate-limit service (gRPC, with gRPC health)
#   listen: "127.0.0.1:8082"
#   domains:                       # envoyproxy/ratelimit's format, inline...
#     - domain: edge
#       descriptors:
#         - key: remote_address
#           rate_limit: {unit: minute, requests_per_unit: 5}
#   files: [ratelimit/api.yaml]    # ...or its files as they are (relative to this file)
#   directory: ratelimit           # ...or every YAML file of a directory, reloaded when it changes
#   tls: {cert_file: tls/tls.crt, key_file: tls/tls.key}   # client_ca_file (and client_san): mutual TLS

# fleet:                           # N replicas enforce one limit through Redis (or Valkey): only hot keys sync
#   redis: "rediss://sketchproxy@redis.internal:6380/0"   # or host:port; or cluster: [seeds] or sentinel: {master, addrs}
#   password_file: /run/secrets/redis-password            # or password_env, the URL, or password: at most one
#   tls: {ca_file: /etc/sketchproxy/redis-ca.pem}         # cert_file and key_file for a client certificate
#   secret_file: /etc/sketchproxy/fleet-secret            # HMAC key for keys sent to Redis, the same everywhere
#   replicas: 0                    # N; 0 counts the replicas that heartbeat
#   min_replicas: 3                # with replicas 0: the replicas you run, N's floor whether Redis answers or not
#   interval: 500ms
#   wallet_on_failure: closed      # budget routes while Redis is away: closed (503) or local (θ/N)

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
  spike_factor: 4                  # new keys/s above 4x their average...
  min_per_second: 50               # ...and above 50/s is a spike
  budget_factor: 0.25              # keys first seen in a spike get 1/4 of each limit and budget
  window: 1m                       # ...until they come back 15-30 s later
  remember: 1h                     # a key seen within about this long is not new
  warmup: 1m                       # no spike is called this long after a start without a state file

headers:
  legacy: false                    # also X-RateLimit-Limit/-Remaining/-Reset

# jwt:                             # for keys a client cannot mint: key: ["jwt:sub"]
#   jwks_url: https://id.example.com/.well-known/jwks.json   # or public_key_file, hmac_secret_file, jwks_file
#   issuer: https://id.example.com
#   audience: api

rules:
  - name: api
    # Paths are matched cleaned and decoded; "/v1/" matches /v1, /v1/ and
    # /v1/x in any letter case (case_sensitive: true to change that).
    match: {host: "api.example.com", path_prefix: "/v1/", methods: [GET, POST]}
    key: ["header:X-API-Key"]      # or ip, query:NAME, or several: [header:X-API-Key, ip]
    allow:
      cidrs: ["192.0.2.0/24"]      # monitoring: no sketch work
      keys: ["internal-batch"]
    tarpit: true                   # tarpit rules count refused requests (refused: count)
    limits:
      - {name: per-second, requests: 10, per: 1s, burst: 20}
      - {name: per-day, requests: 50000, per: 1d}

  - name: llm
    match: {path_prefix: "/v1/chat/"}
    key: ["header:X-API-Key"]
    refused: free                  # refused requests do not count (the default); count: they do
    limits:
      - {name: per-minute, requests: 60, per: 1m}
    budget:                        # wallet defense
      name: tokens
      units: 200000                # per key
      per: 1d
      cost: 500                    # charged when admitted
      reserve: 2000                # held while a request runs: spent + held + reserve must fit
      reconcile_header: X-Tokens-Used   # then what the upstream reports (header or trailer)
      # unit: 10                   # one count = 10 units: needed above 8,388,608 units per period
      fail_open: false             # untracked wallet: 503 (the default)
    max_in_flight: 2               # streams per key (budget rules default to 8)

  - name: per-ip
    key: [ip]
    shadow: true                   # decide, log, count; let through
    limits:
      - {name: per-minute, requests: 600, per: 1m, burst: 100}
`

// MinimalConfig is the smallest configuration worth deploying: the
// proxy, its upstream, the load balancers trusted to name the client, and
// one limit per client address. `sketchproxy -example minimal` prints it,
// and a test runs it.
const MinimalConfig = `# SketchProxy: one limit per client address (sketchproxy -example: every option)
listen: ":8080"
upstream: "http://127.0.0.1:9000"     # your application
admin: "127.0.0.1:9091"               # /metrics and /healthz
client_ip:
  trusted_proxies: ["127.0.0.1/32"]   # your load balancers' addresses: only they may set X-Forwarded-For
rules:
  - name: per-ip
    key: [ip]
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
