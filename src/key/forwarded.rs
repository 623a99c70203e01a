//! The client IP behind trusted reverse proxies.

use std::net::IpAddr;

use http::HeaderMap;
use http::request::Parts;

use super::ip::{Cidr, DEFAULT_IPV6_PREFIX, normalize_ip, parse_node, trim_ows};
use super::{KeyError, KeyExtractor, peer_ip};
use crate::ParseError;

/// The most entries of a forwarded header examined ([`ForwardedIp::MAX_ENTRIES`]).
pub(crate) const MAX_FORWARDED_ENTRIES: usize = 64;

/// The one header a [`ForwardedIp`] extractor reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For`: every field line joined in order, comma-separated (the default).
    #[default]
    XForwardedFor,
    /// `Forwarded` (RFC 7239): the `for=` parameter of each element.
    Forwarded,
    /// `X-Real-IP`: one address set by the proxy (the last field line if several).
    XRealIp,
}

static X_FORWARDED_FOR: http::HeaderName = http::HeaderName::from_static("x-forwarded-for");
static X_REAL_IP: http::HeaderName = http::HeaderName::from_static("x-real-ip");

impl ForwardedHeader {
    /// The header's name.
    pub fn name(self) -> &'static str {
        self.header_name().as_str()
    }

    /// The header's name, ready for lookups (no parsing per request).
    pub(crate) fn header_name(self) -> &'static http::HeaderName {
        match self {
            Self::XForwardedFor => &X_FORWARDED_FOR,
            Self::Forwarded => &http::header::FORWARDED,
            Self::XRealIp => &X_REAL_IP,
        }
    }
}

impl std::str::FromStr for ForwardedHeader {
    type Err = String;

    /// `xff`, `forwarded` or `x-real-ip` (header names accepted too).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "xff" | "x-forwarded-for" => Ok(Self::XForwardedFor),
            "forwarded" => Ok(Self::Forwarded),
            "x-real-ip" | "xrealip" => Ok(Self::XRealIp),
            _ => Err(format!(
                "unknown forwarded header {s:?} (expected xff, forwarded or x-real-ip)"
            )),
        }
    }
}

/// The client IP as reported by trusted reverse proxies.
///
/// - The peer (the connection's address, see [`PeerIp`](super::PeerIp)) must itself lie in a
///   trusted range; otherwise every header is ignored and the peer is the client.
/// - Exactly one header is read ([`ForwardedHeader`], `X-Forwarded-For` by default); the others are
///   never looked at, so an attacker cannot pick the header that suits them.
/// - The list is walked from the right (the entries appended by your proxies) and the first address
///   **not** in a trusted range is the client. At most [`ForwardedIp::MAX_ENTRIES`] entries are
///   examined, however long the header.
/// - An entry that is not an address (`unknown`, `_hidden`, garbage) stops the walk: the right-most
///   trusted hop seen so far is the key (a trusted proxy said it does not know the client).
/// - When every examined entry is trusted, the left-most examined one is the client (a host inside
///   your trusted ranges may set the header).
///
/// Keys are normalised as [`normalize_ip`] says (IPv6 by /56 by default).
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use tollgate::key::{ForwardedIp, KeyExtractor, PeerAddr};
///
/// let xff = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
/// let req = |peer: &str, header: &str| {
///     let mut req = Request::builder().header("x-forwarded-for", header).body(()).unwrap();
///     req.extensions_mut().insert(PeerAddr::new(peer.parse::<SocketAddr>().unwrap()));
///     req.into_parts().0
/// };
/// // Behind the proxy 10.0.0.2: the right-most untrusted entry is the client.
/// let parts = req("10.0.0.2:5000", "6.6.6.6, 203.0.113.7, 10.0.0.1");
/// assert_eq!(xff.extract(&parts).unwrap().to_string(), "203.0.113.7");
/// // From an untrusted peer the header is ignored.
/// let parts = req("198.51.100.1:5000", "203.0.113.7");
/// assert_eq!(xff.extract(&parts).unwrap().to_string(), "198.51.100.1");
/// ```
///
/// # Deployment caveat
/// List only the addresses of proxies you run (or your CDN's published ranges). Trusting
/// `0.0.0.0/0` lets any client choose its own key; it is accepted but logged as a warning once.
#[derive(Clone, Debug)]
pub struct ForwardedIp {
    trusted: Vec<Cidr>,
    header: ForwardedHeader,
    v6_prefix: u8,
}

/// What [`ForwardedIp::resolve`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// The client address (not yet normalised).
    pub(crate) ip: IpAddr,
    /// How many header entries were examined (at most [`ForwardedIp::MAX_ENTRIES`]).
    pub(crate) examined: usize,
}

impl ForwardedIp {
    /// The most entries of a forwarded header examined, counted from the right: a longer header
    /// costs no more.
    pub const MAX_ENTRIES: usize = MAX_FORWARDED_ENTRIES;

    /// Trusts the proxies in `ranges` (CIDR notation, or single addresses).
    ///
    /// # Errors
    /// [`ParseError`] for a range that does not parse.
    pub fn new<I, S>(ranges: I) -> Result<Self, ParseError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let trusted = ranges
            .into_iter()
            .map(|r| r.as_ref().parse())
            .collect::<Result<Vec<Cidr>, _>>()?;
        Ok(Self::from_cidrs(trusted))
    }

    /// Trusts the proxies in `ranges`.
    pub fn from_cidrs(ranges: impl IntoIterator<Item = Cidr>) -> Self {
        let trusted: Vec<Cidr> = ranges.into_iter().collect();
        if trusted.iter().any(Cidr::is_everything) {
            tracing::warn!(
                "rate limiter trusts every proxy (a /0 range): any client can choose its own \
                 rate-limit key through a forwarded header"
            );
        }
        if trusted.is_empty() {
            tracing::warn!(
                "forwarded-IP extractor has no trusted proxy: every header is ignored and the \
                 peer address is used"
            );
        }
        Self {
            trusted,
            header: ForwardedHeader::default(),
            v6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Reads `header` instead of `X-Forwarded-For`.
    #[must_use]
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Keys IPv6 clients by their first `prefix` bits (default 56). See [`PeerIp::ipv6_prefix`](super::PeerIp::ipv6_prefix).
    #[must_use]
    pub fn ipv6_prefix(mut self, prefix: u8) -> Self {
        self.v6_prefix = super::checked_prefix(prefix);
        self
    }

    /// The trusted ranges.
    pub fn trusted(&self) -> &[Cidr] {
        &self.trusted
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|c| c.contains(ip))
    }

    /// The client address for a request from `peer` with `headers`, and the work it took.
    pub(crate) fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> Resolved {
        if !self.is_trusted(peer) {
            return Resolved {
                ip: peer,
                examined: 0,
            };
        }
        let name = self.header.header_name();
        let mut last = peer;
        let mut examined = 0;
        match self.header {
            ForwardedHeader::XRealIp => {
                if let Some(v) = headers.get_all(name).iter().next_back() {
                    examined = 1;
                    if let Some(ip) = parse_node(v.as_bytes()) {
                        last = ip;
                    }
                }
            }
            ForwardedHeader::XForwardedFor | ForwardedHeader::Forwarded => {
                let forwarded = self.header == ForwardedHeader::Forwarded;
                'lines: for line in headers.get_all(name).iter().rev() {
                    for entry in RevSplit::new(line.as_bytes(), forwarded) {
                        if examined >= MAX_FORWARDED_ENTRIES {
                            break 'lines;
                        }
                        examined += 1;
                        if trim_ows(entry).is_empty() {
                            continue;
                        }
                        let node = if forwarded {
                            forwarded_for(entry)
                        } else {
                            Some(entry)
                        };
                        let Some(ip) = node.and_then(parse_node) else {
                            break 'lines;
                        };
                        last = ip;
                        if !self.is_trusted(ip) {
                            break 'lines;
                        }
                    }
                }
            }
        }
        Resolved { ip: last, examined }
    }
}

impl KeyExtractor for ForwardedIp {
    type Key = IpAddr;

    fn extract(&self, parts: &Parts) -> Result<IpAddr, KeyError> {
        let peer = peer_ip(parts)?;
        Ok(normalize_ip(
            self.resolve(peer, &parts.headers).ip,
            self.v6_prefix,
        ))
    }
}

/// Splits a header line at commas from the right, lazily; for `Forwarded`, commas inside quoted
/// strings do not split.
struct RevSplit<'a> {
    rest: Option<&'a [u8]>,
    quotes: bool,
}

impl<'a> RevSplit<'a> {
    fn new(line: &'a [u8], quotes: bool) -> Self {
        Self {
            rest: Some(line),
            quotes,
        }
    }
}

impl<'a> Iterator for RevSplit<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.rest?;
        let mut quoted = false;
        let mut at = None;
        for (i, &b) in rest.iter().enumerate().rev() {
            if self.quotes && b == b'"' {
                quoted = !quoted;
            } else if b == b',' && !quoted {
                at = Some(i);
                break;
            }
        }
        match at {
            Some(i) => {
                self.rest = rest.get(..i);
                rest.get(i + 1..)
            }
            None => {
                self.rest = None;
                Some(rest)
            }
        }
    }
}

/// The value of the `for` parameter (any case) of one `Forwarded` element.
fn forwarded_for(element: &[u8]) -> Option<&[u8]> {
    let mut quoted = false;
    let mut start = 0;
    let mut found = None;
    for i in 0..=element.len() {
        let b = element.get(i).copied();
        match b {
            Some(b'"') => quoted = !quoted,
            Some(b';') | None if !quoted => {
                let pair = trim_ows(element.get(start..i).unwrap_or(&[]));
                if let Some(eq) = pair.iter().position(|&c| c == b'=') {
                    let (name, value) = pair.split_at(eq);
                    if trim_ows(name).eq_ignore_ascii_case(b"for") {
                        // More than one `for` in one element is malformed.
                        if found.is_some() {
                            return None;
                        }
                        found = value.get(1..);
                    }
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(name: &str, lines: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(l).unwrap(),
            );
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A 1 MiB header of 10^5 entries costs at most `MAX_ENTRIES` entries, in both header forms.
    #[test]
    fn oversized_headers_are_walked_over_a_bounded_number_of_entries() {
        let x = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        let xff = format!("{}10.1.2.3", "10.9.9.9, ".repeat(100_000));
        let r = x.resolve(
            ip("10.0.0.1"),
            &headers("x-forwarded-for", &[xff.as_bytes()]),
        );
        assert_eq!(
            (r.ip, r.examined),
            (ip("10.9.9.9"), ForwardedIp::MAX_ENTRIES)
        );
        let attack = format!("{}203.0.113.7, 10.1.1.1", "6.6.6.6, ".repeat(100_000));
        let r = x.resolve(
            ip("10.0.0.1"),
            &headers("x-forwarded-for", &[attack.as_bytes()]),
        );
        assert_eq!((r.ip, r.examined), (ip("203.0.113.7"), 2));
        let fwd = format!("{}for=10.1.1.1", "for=10.2.2.2, ".repeat(80_000));
        let r = x
            .header(ForwardedHeader::Forwarded)
            .resolve(ip("10.0.0.1"), &headers("forwarded", &[fwd.as_bytes()]));
        assert_eq!(r.examined, ForwardedIp::MAX_ENTRIES);
    }

    #[test]
    fn rightmost_untrusted_across_lines() {
        let x = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        let h = headers(
            "x-forwarded-for",
            &[b"6.6.6.6, 1.1.1.1", b"203.0.113.7:443", b"10.0.0.1"],
        );
        let r = x.resolve(ip("10.0.0.2"), &h);
        assert_eq!((r.ip, r.examined), (ip("203.0.113.7"), 2));
    }

    #[test]
    fn forwarded_elements_with_quotes_and_case() {
        let x = ForwardedIp::new(["10.0.0.0/8"])
            .unwrap()
            .header(ForwardedHeader::Forwarded);
        let h = headers(
            "forwarded",
            &[b"for=6.6.6.6, For=\"[2001:db8::1]:4711\";proto=\"a,b;c\", for=10.0.0.1;by=x"],
        );
        assert_eq!(x.resolve(ip("10.0.0.2"), &h).ip, ip("2001:db8::1"));
        let h = headers("forwarded", &[b"for=6.6.6.6, for=unknown, for=10.0.0.1"]);
        assert_eq!(
            x.resolve(ip("10.0.0.2"), &h).ip,
            ip("10.0.0.1"),
            "unknown stops the walk at the last trusted hop"
        );
    }

    #[test]
    fn all_trusted_takes_the_leftmost_examined() {
        let x = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        let h = headers("x-forwarded-for", &[b"10.0.0.9, 10.0.0.1"]);
        assert_eq!(x.resolve(ip("10.0.0.2"), &h).ip, ip("10.0.0.9"));
    }

    #[test]
    fn x_real_ip_reads_the_last_line() {
        let x = ForwardedIp::new(["10.0.0.0/8"])
            .unwrap()
            .header(ForwardedHeader::XRealIp);
        let h = headers("x-real-ip", &[b"6.6.6.6", b"203.0.113.7"]);
        assert_eq!(x.resolve(ip("10.0.0.2"), &h).ip, ip("203.0.113.7"));
    }
}
