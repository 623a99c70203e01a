//! The `server` example: the demo's every flag, then the playground and the simulator.
//!
//! `examples/server.rs` is a configurable demo: `GET /` answers `ok`, every request (404s too) goes
//! through the limiter. It prints exactly one line on stdout, `listening on http://ADDR`, and logs to
//! stderr (`RUST_LOG=tollgate=debug` for one line per rejection); SIGINT and SIGTERM stop it with exit
//! code 0. A usage or configuration error exits 2 with a one-line message; a failure at run time (the
//! port is taken, Redis unreachable or refusing) exits 1. No message prints a Redis password.
//!
//! ```sh
//! cargo run --example server -- --help                       # every flag, with its default
//! cargo run --example server -- --addr localhost:3000 --strategy token-bucket --quota 5/minute --burst 2
//! cargo run --example server -- --key header:x-api-key --cost 2 --delay-ms 200
//! cargo run --example server -- --cost 10 --settle-header x-used    # GET /?used=3 is charged 3
//! cargo run --example server -- --concurrency 2 --delay-ms 2000      # a third request at once: 429
//! cargo run --example server -- --rules examples/rules.toml   # limits from a file, reloaded; /metrics
//! # The Redis store needs the `redis` feature (a build without it exits 2 and says so):
//! cargo run --features redis --example server -- --store redis://127.0.0.1:6379
//! cargo run --features redis --example server -- --store redis+cluster://127.0.0.1:7000,127.0.0.1:7001
//! ```
//!
//! Every flag below is parsed and checked. A flag that has no effect in the chosen combination (`--burst` with a
//! window strategy, `--max-keys` with Redis, `--store-timeout` with the memory store, ...) prints one
//! warning on stderr; one that cannot apply exits 2 saying why, never ignored. With `--rules`, the
//! per-limit flags exit 2 ("set it in the rules file") and the process-wide flags apply to every
//! limit of the file; the last column says how. Repeating a single-valued flag keeps the last value;
//! `--quota` and `--trust-proxy` add up.
//!
//! | Flag | Default | Effect (memory store unless said) | With `--rules` |
//! | --- | --- | --- | --- |
//! | `--addr HOST:PORT` | `127.0.0.1:3000` | listen address; a host name is resolved and the first address that binds is used; port 0 picks a free port | process-wide |
//! | `--strategy NAME` | `sliding-window` | `fixed-window`, `fixed-window-first-hit`, `moving-window`, `sliding-window`, `token-bucket`, `leaky-bucket` | exit 2: set `strategy` in the file |
//! | `--quota Q` | `10/minute` | quotas, repeatable or `;`-separated (`"5/second; 100/minute"`); all must admit | exit 2: set `quotas` in the file |
//! | `--burst B` | the quota's limit | capacity of `token-bucket` and `leaky-bucket`; with a window strategy it warns and is ignored | exit 2: set `burst` in the file |
//! | `--key ip\|header:NAME\|global` | `ip` | what identifies a client | exit 2: set `key` in the file |
//! | `--on-missing-key reject\|global` | `reject` | a request without a key: 400, or the one shared global bucket; warns with `--key global` | the default of each limit's `on_missing_key` |
//! | `--trust-proxy CIDR` | none | repeatable; the `ip` key reads the forwarded header of peers in these ranges; warns with another key | the `ip` key part of every limit |
//! | `--forwarded-header xff\|forwarded\|x-real-ip` | `xff` | the header trusted proxies set; warns without `--trust-proxy` | the `ip` key part of every limit |
//! | `--store memory\|URL` | `memory` | `redis://H:P[/DB]`, `rediss://...`, `redis+cluster://H1:P1,H2:P2`, `rediss+cluster://...` (needs `--features redis`); `redis+sentinel://[user:pass@]H1:P1[,H2:P2]/SERVICE[/DB]` and `rediss+sentinel://...`; an unreachable Redis is not a start-up error (the server answers by `--fail-mode` and connects in the background) | every limit on that store: in memory one store per limit (with `--max-keys`), on Redis clones of one store, every URL form |
//! | `--fail-mode open\|closed\|local` | `open` | on a store failure: pass, 503, or a local limiter of the same rule (its limit divided by `--instances`); overload is never a failure (shed as 429); warns with the memory store, which never fails | every limit without its own `fail_mode`; `local` gives the Redis store a local limiter (its limit divided by `--instances`), which a limit's `fail_mode = "local"` needs (without it: exit 2 with `line L, column C`); a limit's `open` or `closed` still fails its own way |
//! | `--fail-closed` | off | alias of `--fail-mode closed`; with a contradicting `--fail-mode`, exit 2 | every limit |
//! | `--reset-format delta\|unix` | `delta` | `x-ratelimit-reset` as seconds from now or Unix time | every limit |
//! | `--max-keys N` | 8 x 10^6 (the store's default) | cap on the keys the memory store holds; warns with Redis | each limit's memory store; warns with Redis |
//! | `--store-timeout MS` | 50 | how long a Redis decision may take; warns with the memory store | the Redis store of every limit; warns with the memory store |
//! | `--redis-ca FILE` | none | PEM CA bundle for `rediss://`; exit 2 with a non-TLS store | the Redis store of every limit; exit 2 with a non-TLS store |
//! | `--redis-cert FILE`, `--redis-key FILE` | none | client certificate and key for `rediss://` (both or neither); exit 2 with a non-TLS store | the Redis store of every limit; exit 2 with a non-TLS store |
//! | `--instances N` | 1 | `--fail-mode local` divides the limit by N; warns without it | as without `--rules`: the local limiter of every limit |
//! | `--redis-lease [on\|off]` | `off` | quota leasing on the Redis store (bare flag = `on`) with the library's default lease sizes; a strategy leasing cannot bound (moving window, first-hit window, leaky bucket) exits 2 saying why; warns with the memory store | leasing on the store of every limit whose strategy leasing can bound; the others (moving window, first-hit window, leaky bucket, shaping queues) are checked by a Redis call each, named in one warning at start (a limit a reload adds is checked the same way, without a warning) |
//! | `--rules FILE` | none | limits from a TOML rules file (see `examples/rules.toml`), every path and method answered `ok`; a file that cannot be used exits 2 with `line L, column C` | — |
//! | `--reload-interval MS` | 1000 | how often the rules file is polled; 0 disables, below 50 exits 2; warns without `--rules` | the file is polled at this interval, compiled off the request path and swapped in |
//! | `--settle-header NAME` | none | the handler answers with header NAME set verbatim to the query parameter `used` (default: the estimate) and the limiter settles to it; a missing, negative, non-numeric or too large value leaves the estimate (warned once) | the handler sets header NAME to `used` on every path (no estimate: without `used` no header); the limits with `settle = "header:NAME"` settle to it, the others keep their estimate |
//! | `--cost N` | 1 | units each request costs (0 = a peek that never spends); the estimate with `--settle-header` (at least 1 there) | exit 2: set `cost` in the file |
//! | `--concurrency N` | none | cap on requests in flight per key (429 at once above it, `Retry-After: 1`); on Redis shared by the instances (leases: two Redis calls per request) | exit 2: set concurrency in the rules file (`concurrency = N` per limit; on Redis shared by the instances, as here) |
//! | `--delay-ms MS` | 0 | the `GET /` handler takes this long (at most 600000) | every path takes this long |
//! | `--window-offset OFFSET` | `+00:00` | UTC offset of clock-aligned windows (`+08:00`, `-5h`, `30m`, `5h30m`; under 24 h) for `fixed-window` and `sliding-window` (memory and Redis); warns with other strategies | exit 2: set `window_offset` in the file |
//! | `--queue MAX_WAIT_MS` | off | with `leaky-bucket`, a FIFO queue drained at the constant rate: each request leaves at its reserved departure, one interval after the previous, or gets 429 at once if that is more than MAX_WAIT_MS away (memory and Redis); warns with other strategies | exit 2: set `queue_ms` in the file |
//!
//! `GET /metrics` is served in every mode and never limited: the `tollgate_*` [metrics](super::metrics) in the
//! Prometheus text format (through `metrics-exporter-prometheus`). In production, expose it on an
//! internal port or behind your own access control, never to clients.
//!
//! # The playground and the simulator
//!
//! ```sh
//! cargo run --example playground -- --addr 127.0.0.1:8080   # then open http://127.0.0.1:8080
//! ```
//!
//! The playground runs the six strategies side by side on the same requests, in the browser: a timeline
//! per strategy (filled dots admitted, crosses rejected), its window or bucket drawn (window edges, the
//! sliding counter's weighted previous window, the bucket's level) and its counts. An automatic stream
//! runs at load (steady, bursts, or the edge attack that gets `2N` through a fixed window); **Hit** sends
//! one request to every panel at the same instant; quota and burst can be changed on the page. A chat
//! tab throttles a spammer with a token bucket of 3 refilling one every 4 seconds, per user. Every
//! decision is made by tollgate on the server (one limiter per strategy, where a page session is a key
//! checked under a rule made from its settings, on a `ManualClock` set to the request's time); the page
//! only draws. It needs no network: HTML, CSS and JS
//! are embedded in the binary. Sessions are bounded (256, least recently used evicted) and expire after
//! 10 idle minutes (`--session-idle SECS`).
//!
//! The simulator replays a trace through every strategy (or those named with `--strategy`) on a manual
//! clock and draws what each admits:
//!
//! ```sh
//! cargo run --example simulate -- --trace trace.csv --quota "10/minute" [--burst B] [--strategy NAME]... --out DIR
//! cargo run --example simulate -- --traffic edge-attack --quota 5/10s --out DIR
//! cargo run --example simulate -- --traffic poisson:2,600 --seed 7 --quota 10/minute --out DIR
//! cargo run --example simulate -- --traffic bursts:20,15000,300 --quota 10/minute --out DIR
//! ```
//!
//! A trace has one request per line, `t_ms[,key[,cost]]`: integer milliseconds from the start of the
//! trace (which starts at a whole UTC day, so clock-aligned windows start at `t = 0`), non-decreasing;
//! the key defaults to one key (an empty field), the cost to 1; blank lines and `#` comments are skipped.
//! It writes `DIR/decisions.csv` (`strategy,t_ms,key,cost,allowed`), `DIR/<strategy>.svg` and
//! `DIR/summary.md` (admitted and rejected per strategy, and the sliding counter's false allows and false
//! rejects against the exact log on the same arrivals). A bad trace exits with code 2 and `line N: ...`;
//! a cost no quota can admit is a rejected row.
//!
//! The edge attack (`--traffic edge-attack --quota 5/10s --burst 5`): five requests 100 ms before the
//! window edge at 10 s and five at it, the same at 30 s. Only the clock-aligned fixed window lets ten
//! through within 100 ms. `scripts/plots.sh` regenerates the README's pictures of it and the playground's screenshot.
