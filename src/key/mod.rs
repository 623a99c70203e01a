//! Which bucket a request counts against: the [`KeyExtractor`] trait and the stock extractors.
//!
//! | extractor | key | reads |
//! | --- | --- | --- |
//! | [`PeerIp`] | the connection's IP (IPv6 by /56) | [`PeerAddr`], axum's `ConnectInfo<SocketAddr>` (feature `axum`), or tonic's `TcpConnectInfo` (feature `tonic`) |
//! | [`ForwardedIp`] | the client IP behind trusted proxies | one forwarded header, only from trusted peers |
//! | [`HeaderKey`] | a header's value (an API key), long values hashed | one header |
//! | [`ExtensionKey`] | a value an earlier layer put in the request (a user id) | request extensions |
//! | [`GlobalKey`] | one key for every request | nothing |
//! | a closure `Fn(&Parts) -> Option<K>` | anything | anything in the request head |
//! | a tuple `(A, B)` / `(A, B, C)` | every part (e.g. IP + username) | what each part reads |
//!
//! Extractors see the request head ([`http::request::Parts`]), never the body. An extractor that
//! finds no usable key returns a [`KeyError`]: the layer answers `400` or counts the request under
//! a shared fallback key, never passes it unlimited. Which key to trust behind proxies, IPv6
//! prefixes, and keys a client can choose freely: the guide's [keys and
//! proxies](crate::guide::keys) chapter.

mod forwarded;
mod ip;

use std::fmt;
use std::marker::PhantomData;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};

use http::HeaderName;
use http::header::InvalidHeaderName;
use http::request::Parts;
use sha2::{Digest, Sha256};

use crate::store::StoreKey;

#[cfg(any(test, fuzzing))]
pub(crate) use forwarded::MAX_FORWARDED_ENTRIES;
pub use forwarded::{ForwardedHeader, ForwardedIp};
pub(crate) use ip::DEFAULT_IPV6_PREFIX;
pub use ip::{Cidr, normalize_ip};

/// Finds the key a request is counted under.
///
/// Implemented for the stock extractors of this module, for closures `Fn(&Parts) -> Option<K>`,
/// and for tuples of extractors (composite keys, length-prefixed when encoded). The key type must
/// implement [`StoreKey`]: `ExtensionKey<UserId>` needs `UserId: StoreKey`.
///
/// ```compile_fail
/// // A user id without `StoreKey`: the compiler names `StoreKey`, not only `KeyExtractor`.
/// #[derive(Clone, PartialEq, Eq, Hash)]
/// struct UserId(u64);
/// fn needs_extractor<X: tollgate::key::KeyExtractor>(_: X) {}
/// needs_extractor(tollgate::key::ExtensionKey::<UserId>::new());
/// ```
///
/// ```
/// use tollgate::store::StoreKey;
/// #[derive(Clone, PartialEq, Eq, Hash)]
/// struct UserId(u64);
/// impl StoreKey for UserId {
///     fn encode(&self, out: &mut Vec<u8>) {
///         out.extend_from_slice(&self.0.to_be_bytes());
///     }
/// }
/// fn needs_extractor<X: tollgate::key::KeyExtractor>(_: X) {}
/// needs_extractor(tollgate::key::ExtensionKey::<UserId>::new());
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a key extractor",
    label = "not a `KeyExtractor`",
    note = "for `ExtensionKey<T>` and closures returning `Option<T>`, `T` must implement \
            `tollgate::store::StoreKey` (a stable byte encoding of the key)"
)]
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key.
    type Key: StoreKey;

    /// The request's key.
    ///
    /// # Errors
    /// [`KeyError`] when the request carries no usable key; the layer answers as configured.
    fn extract(&self, parts: &Parts) -> Result<Self::Key, KeyError>;
}

impl<F, K> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<K> + Send + Sync + 'static,
    K: StoreKey,
{
    type Key = K;

    fn extract(&self, parts: &Parts) -> Result<K, KeyError> {
        self(parts).ok_or(KeyError::new("the key closure found no key"))
    }
}

macro_rules! tuple_extractors {
    ($($name:ident),+) => {
        impl<$($name: KeyExtractor),+> KeyExtractor for ($($name,)+) {
            type Key = ($($name::Key,)+);

            #[allow(non_snake_case)]
            fn extract(&self, parts: &Parts) -> Result<Self::Key, KeyError> {
                let ($($name,)+) = self;
                Ok(($($name.extract(parts)?,)+))
            }
        }
    };
}
tuple_extractors!(A, B);
tuple_extractors!(A, B, C);

/// Why no key could be extracted. Put into the extensions of the `400` response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyError {
    reason: &'static str,
}

impl KeyError {
    /// A key error with a short reason (shown in the 400 body and logs).
    pub const fn new(reason: &'static str) -> Self {
        Self { reason }
    }

    /// The reason.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no rate-limit key: {}", self.reason)
    }
}

impl std::error::Error for KeyError {}

/// The peer address of a connection, for servers without axum: insert it into every request's
/// extensions (see the `hyper` example). [`PeerIp`] and [`ForwardedIp`] read it first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerAddr(SocketAddr);

impl PeerAddr {
    /// The peer address `addr`.
    pub const fn new(addr: SocketAddr) -> Self {
        Self(addr)
    }

    /// The address.
    pub const fn addr(&self) -> SocketAddr {
        self.0
    }
}

impl From<SocketAddr> for PeerAddr {
    fn from(addr: SocketAddr) -> Self {
        Self(addr)
    }
}

static WARNED_NO_PEER: AtomicBool = AtomicBool::new(false);
static WARNED_FORWARDED: AtomicBool = AtomicBool::new(false);
static WARNED_PREFIX: AtomicBool = AtomicBool::new(false);

/// `true` for one call in 64 on each thread (the first among them).
fn one_in_64() -> bool {
    thread_local! {
        static CALLS: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
    }
    CALLS.with(|c| {
        let n = c.get().wrapping_add(1);
        c.set(n);
        n % 64 == 1
    })
}

/// Logs `message` the first time `flag` is seen unset (misconfiguration: once, not per request).
pub(crate) fn warn_once(flag: &AtomicBool, message: &'static str) {
    if !flag.swap(true, Ordering::Relaxed) {
        tracing::warn!("{message}");
    }
}

pub(crate) fn peer_ip(parts: &Parts) -> Result<IpAddr, KeyError> {
    if let Some(PeerAddr(a)) = parts.extensions.get::<PeerAddr>() {
        return Ok(a.ip());
    }
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(a)) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Ok(a.ip());
    }
    #[cfg(feature = "tonic")]
    if let Some(a) = parts
        .extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(tonic::transport::server::TcpConnectInfo::remote_addr)
    {
        return Ok(a.ip());
    }
    warn_once(
        &WARNED_NO_PEER,
        "rate limiter found no peer address in a request: serve axum with \
         `into_make_service_with_connect_info::<SocketAddr>()`, serve tonic with its TCP \
         incoming (feature `tonic`), or insert `tollgate::key::PeerAddr` per connection",
    );
    Err(KeyError::new("the peer address is unknown"))
}

fn checked_prefix(prefix: u8) -> u8 {
    if !(32..=64).contains(&prefix) {
        warn_once(
            &WARNED_PREFIX,
            "rate limiter keys IPv6 clients by a prefix outside /32../64: shorter prefixes put many \
             subscribers in one bucket, longer ones let one subscriber rotate through many",
        );
    }
    prefix.min(128)
}

/// The peer's IP address from the connection (never from a header). IPv6 clients are keyed by
/// their /56 by default, IPv4-mapped IPv6 addresses as IPv4 (see [`normalize_ip`]).
///
/// Reads [`PeerAddr`], then axum's `ConnectInfo<SocketAddr>` (feature `axum`), then tonic's
/// `TcpConnectInfo` (feature `tonic`, set by `tonic::transport::Server`). Without any the request
/// has no key (logged once).
///
/// It never reads a header: if requests arrive with forwarded headers while it is in use (behind a
/// proxy, every client would share the proxy's bucket), a warning is logged once.
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use tollgate::key::{HeaderKey, KeyExtractor, PeerAddr, PeerIp};
///
/// let ip_and_key = (PeerIp::default(), HeaderKey::new("x-api-key"));
/// let mut req = Request::builder().header("x-api-key", "k1").body(()).unwrap();
/// let peer: SocketAddr = "[2001:db8:0:1::5]:443".parse().unwrap();
/// req.extensions_mut().insert(PeerAddr::new(peer));
/// let (ip, key) = ip_and_key.extract(&req.into_parts().0).unwrap();
/// assert_eq!(ip.to_string(), "2001:db8::", "IPv6 keyed by its /56");
/// assert_eq!(key.as_bytes(), b"\0k1");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerIp {
    v6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> Self {
        Self {
            v6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

impl PeerIp {
    /// The prefix IPv6 clients are keyed by unless told otherwise (here and in [`ForwardedIp`]):
    /// one subscriber owns at least a /64, often a /56.
    pub const DEFAULT_IPV6_PREFIX: u8 = DEFAULT_IPV6_PREFIX;

    /// Keys IPv6 clients by their first `prefix` bits (default 56; 64 keys each subscriber LAN
    /// apart, 128 each address). A value outside 32..=64 is accepted with a warning (once).
    #[must_use]
    pub fn ipv6_prefix(mut self, prefix: u8) -> Self {
        self.v6_prefix = checked_prefix(prefix);
        self
    }
}

impl KeyExtractor for PeerIp {
    type Key = IpAddr;

    fn extract(&self, parts: &Parts) -> Result<IpAddr, KeyError> {
        // Only until the warning has been given, and on one request in 64 (a proxy in front sends
        // the header on every request, so it is seen at once): three header lookups cost more than
        // the rate-limit decision itself.
        if !WARNED_FORWARDED.load(Ordering::Relaxed)
            && one_in_64()
            && [
                ForwardedHeader::XForwardedFor,
                ForwardedHeader::Forwarded,
                ForwardedHeader::XRealIp,
            ]
            .iter()
            .any(|h| parts.headers.contains_key(h.header_name()))
        {
            warn_once(
                &WARNED_FORWARDED,
                "requests carry forwarded headers but the rate limiter keys by the peer address: \
                 behind a proxy every client shares one bucket; use `key::ForwardedIp` with the \
                 proxy's address as trusted",
            );
        }
        Ok(normalize_ip(peer_ip(parts)?, self.v6_prefix))
    }
}

/// Values up to this many bytes are keys as they are ([`ValueKey::MAX_RAW_VALUE`]).
pub(crate) const MAX_RAW_VALUE: usize = 64;

/// A key made from bytes of the request (a header value, a username): the value itself when it is
/// at most [`ValueKey::MAX_RAW_VALUE`] bytes, else its SHA-256 digest (domain-separated), so every key is
/// small and an attacker cannot craft a value that collides with another's bucket.
///
/// The first byte tells the two forms apart (0: raw, 1: hashed).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ValueKey(Box<[u8]>);

impl ValueKey {
    /// Values up to this many bytes are keys as they are; longer ones are hashed.
    pub const MAX_RAW_VALUE: usize = MAX_RAW_VALUE;

    /// The key for `value`.
    pub fn new(value: &[u8]) -> Self {
        let mut out = Vec::with_capacity(1 + value.len().min(MAX_RAW_VALUE.max(32)));
        if value.len() <= MAX_RAW_VALUE {
            out.push(0);
            out.extend_from_slice(value);
        } else {
            let mut h = Sha256::new();
            h.update(b"tollgate/value-key/v1\0");
            h.update((value.len() as u64).to_be_bytes());
            h.update(value);
            out.push(1);
            out.extend_from_slice(&h.finalize());
        }
        Self(out.into_boxed_slice())
    }

    /// A username as a key: surrounding whitespace trimmed, Unicode lowercase (so `Alice` and
    /// `alice` share a bucket), then as [`ValueKey::new`] (a 10 KB name costs a fixed-size key).
    /// Unicode normalisation (NFC) is not applied: normalise earlier if your usernames may arrive
    /// decomposed.
    pub fn username(name: &str) -> Self {
        Self::new(name.trim().to_lowercase().as_bytes())
    }

    /// The key's bytes (tag byte first).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for ValueKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ValueKey({:?})", String::from_utf8_lossy(&self.0))
    }
}

impl StoreKey for ValueKey {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.0);
    }
}

/// A header's value as the key (e.g. `x-api-key`). Absent, empty or repeated headers have no key.
/// Any bytes are accepted (non-UTF-8 too); values longer than [`ValueKey::MAX_RAW_VALUE`] are hashed.
///
/// See the module docs on unauthenticated headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys by the header `name`.
    ///
    /// # Panics
    /// When `name` is not a valid header name (a static string you wrote: checked once, at start).
    /// Use [`HeaderKey::try_new`] for names from configuration.
    #[allow(clippy::panic)]
    pub fn new(name: &'static str) -> Self {
        match Self::try_new(name) {
            Ok(k) => k,
            Err(e) => panic!("{e}: {name:?}"),
        }
    }

    /// Keys by the header `name`.
    ///
    /// # Errors
    /// `http`'s `InvalidHeaderName` when `name` is not a valid header name.
    pub fn try_new(name: &str) -> Result<Self, InvalidHeaderName> {
        HeaderName::from_bytes(name.as_bytes()).map(|name| Self { name })
    }

    /// The header's name.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl KeyExtractor for HeaderKey {
    type Key = ValueKey;

    fn extract(&self, parts: &Parts) -> Result<ValueKey, KeyError> {
        header_value_key(&parts.headers, &self.name)
    }
}

/// The key of header `name`: its one value, surrounding whitespace trimmed; missing, repeated
/// (which copy counts cannot be told) or empty, an error. Shared by [`HeaderKey`] and the
/// `header:NAME` key of a rules file.
pub(crate) fn header_value_key(
    headers: &http::HeaderMap,
    name: &http::HeaderName,
) -> Result<ValueKey, KeyError> {
    let mut values = headers.get_all(name).iter();
    let value = values
        .next()
        .ok_or(KeyError::new("the key header is missing"))?;
    if values.next().is_some() {
        return Err(KeyError::new("the key header is repeated"));
    }
    let bytes = ip::trim_ows(value.as_bytes());
    if bytes.is_empty() {
        return Err(KeyError::new("the key header is empty"));
    }
    Ok(ValueKey::new(bytes))
}

/// A value that an earlier layer put into the request's extensions (an authenticated user id).
pub struct ExtensionKey<T>(PhantomData<fn() -> T>);

impl<T> ExtensionKey<T> {
    /// Keys by the extension of type `T`.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Default for ExtensionKey<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for ExtensionKey<T> {}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExtensionKey<{}>", std::any::type_name::<T>())
    }
}

impl<T: StoreKey> KeyExtractor for ExtensionKey<T> {
    type Key = T;

    fn extract(&self, parts: &Parts) -> Result<T, KeyError> {
        parts
            .extensions
            .get::<T>()
            .cloned()
            .ok_or(KeyError::new("the key extension is missing"))
    }
}

/// One key for every request: a global limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    type Key = ();

    fn extract(&self, _parts: &Parts) -> Result<(), KeyError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(req: Request<()>) -> Parts {
        req.into_parts().0
    }

    #[test]
    fn header_key_handles_missing_empty_repeated_and_binary() {
        let k = HeaderKey::new("x-api-key");
        let r = Request::builder().body(()).unwrap();
        assert!(k.extract(&parts(r)).is_err());
        let r = Request::builder()
            .header("x-api-key", " ")
            .body(())
            .unwrap();
        assert!(k.extract(&parts(r)).is_err());
        let r = Request::builder()
            .header("x-api-key", "a")
            .header("x-api-key", "b")
            .body(())
            .unwrap();
        assert!(k.extract(&parts(r)).is_err());
        let v = http::HeaderValue::from_bytes(&[0xff, 0x80, b'a']).unwrap();
        let r = Request::builder().header("x-api-key", v).body(()).unwrap();
        assert_eq!(
            k.extract(&parts(r)).unwrap().as_bytes(),
            &[0, 0xff, 0x80, b'a']
        );
    }

    #[test]
    fn long_values_hash_to_a_fixed_size_and_never_collide_with_raw_ones() {
        let long = vec![b'x'; 65_536];
        let k = ValueKey::new(&long);
        assert_eq!(k.as_bytes().len(), 33);
        assert_ne!(ValueKey::new(k.as_bytes()), k);
        assert_eq!(ValueKey::username(" Alice "), ValueKey::username("alice"));
    }

    #[test]
    fn closures_and_tuples_are_extractors() {
        let by_path = |p: &Parts| Some(p.uri.path().to_owned());
        let both = (by_path, GlobalKey);
        let r = Request::builder().uri("/a").body(()).unwrap();
        assert_eq!(both.extract(&parts(r)).unwrap(), ("/a".to_owned(), ()));
        let none = |_: &Parts| None::<String>;
        let r = Request::builder().body(()).unwrap();
        assert!(none.extract(&parts(r)).is_err());
    }
}
