//! Keys and proxies: the key decides whose quota a request spends, so whoever controls the key
//! controls the limit.
//!
//! - The default key, [`PeerIp`](crate::key::PeerIp), is the peer address of the connection, never a
//!   header. axum users serve with `into_make_service_with_connect_info::<SocketAddr>()`; plain hyper
//!   users insert a [`PeerAddr`](crate::key::PeerAddr) into each request's extensions (the `hyper`
//!   example); tonic servers get it with the `tonic` feature ([gRPC](super::grpc)).
//! - Forwarded headers are read only by [`ForwardedIp`](crate::key::ForwardedIp), which is given the
//!   trusted proxy ranges and exactly one source header ([`ForwardedHeader`](crate::key::ForwardedHeader)):
//!   `X-Forwarded-For` by default (all its lines, in order), `Forwarded` (RFC 7239) or `X-Real-IP`.
//!   It ignores the header when the peer itself is not a trusted proxy; otherwise it walks the entries
//!   from the right and takes the right-most address outside the trusted ranges, so addresses a
//!   client writes to the left of what your proxies appended change nothing. It stops at an entry that
//!   is not an address and examines at most [`ForwardedIp::MAX_ENTRIES`](crate::key::ForwardedIp::MAX_ENTRIES)
//!   (64) entries. It never takes "the first header that parses".
//! - IPv6 clients are keyed by their `/56` ([`PeerIp::DEFAULT_IPV6_PREFIX`](crate::key::PeerIp::DEFAULT_IPV6_PREFIX),
//!   configurable with `ipv6_prefix`): one subscriber usually holds at least a `/64`, often a `/56`.
//!   IPv4-mapped IPv6 addresses are keyed as the IPv4 address.
//! - A key taken from a header a client chooses freely ([`HeaderKey`](crate::key::HeaderKey): an API
//!   key on an unauthenticated route) gives an attacker a new bucket per request: put the layer after
//!   authentication and key by the authenticated identity ([`ExtensionKey`](crate::key::ExtensionKey),
//!   a value an earlier layer inserted), or combine the value with the IP (a tuple of extractors is a
//!   composite key). [`GlobalKey`](crate::key::GlobalKey) is one key for every request.
//! - Long values are hashed with SHA-256 (domain-separated), not a fast hash: nobody can craft a value
//!   that lands in a victim's bucket.
//! - A request without a usable key gets `400` by default, or a shared fallback key
//!   ([`KeyPolicy::fallback`](crate::layer::KeyPolicy::fallback), given to
//!   [`RateLimitLayer::keys`](crate::RateLimitLayer::keys)): never a panic and never a silent pass.
//! - Your own key type implements [`StoreKey`](crate::store::StoreKey): a stable, injective byte
//!   encoding (Redis names keys by it). Logs show a key only with
//!   [`KeyPolicy::log_keys`](crate::layer::KeyPolicy::log_keys), and then as a short keyed hash
//!   unless it is an IP.
//!
//! ```
//! use std::net::{IpAddr, SocketAddr};
//! use tollgate::key::{ForwardedHeader, ForwardedIp, HeaderKey, KeyExtractor, PeerAddr, PeerIp};
//!
//! // Behind proxies in 10.0.0.0/8 that append to `X-Forwarded-For`:
//! let key = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
//! let request = |peer: &str| {
//!     let peer: SocketAddr = peer.parse().unwrap();
//!     // A client wrote 1.2.3.4 itself; the proxy appended the address it saw.
//!     let (parts, ()) = http::Request::get("/")
//!         .header("x-forwarded-for", "1.2.3.4, 198.51.100.7")
//!         .extension(PeerAddr::new(peer))
//!         .body(())
//!         .unwrap()
//!         .into_parts();
//!     parts
//! };
//! let client: IpAddr = "198.51.100.7".parse().unwrap();
//! assert_eq!(key.extract(&request("10.0.0.2:4000")).unwrap(), client);
//! // A peer that is not a trusted proxy is keyed by its own address.
//! let stranger: IpAddr = "203.0.113.9".parse().unwrap();
//! assert_eq!(key.extract(&request("203.0.113.9:4000")).unwrap(), stranger);
//!
//! // RFC 7239 instead, and a composite key: the client IP and an API key together.
//! let forwarded = ForwardedIp::new(["10.0.0.0/8"]).unwrap().header(ForwardedHeader::Forwarded);
//! let composite = (PeerIp::default(), HeaderKey::new("x-api-key"));
//! # fn is_key<X: KeyExtractor>(_: &X) {}
//! # is_key(&forwarded); is_key(&composite);
//! // A range that does not parse is an error, not a panic:
//! assert!(ForwardedIp::new(["10.0.0.0/33"]).is_err());
//! ```
