//! IP address normalisation (IPv6 prefixes, IPv4-mapped addresses) and CIDR ranges.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::quota::{ParseError, ParseErrorKind};

/// The default prefix IPv6 clients are keyed by ([`PeerIp::DEFAULT_IPV6_PREFIX`](super::PeerIp)).
pub(crate) const DEFAULT_IPV6_PREFIX: u8 = 56;

/// The key an IP address is counted under: IPv4 as the address (/32); an IPv4-mapped IPv6 address
/// (`::ffff:1.2.3.4`) as its IPv4 address; other IPv6 addresses masked to their first
/// `v6_prefix` bits (values above 128 count as 128).
///
/// ```
/// use std::net::IpAddr;
/// use tollgate::key::normalize_ip;
///
/// let a: IpAddr = "2001:db8:1:2ff:aaaa::1".parse().unwrap();
/// assert_eq!(normalize_ip(a, 56), "2001:db8:1:200::".parse::<IpAddr>().unwrap());
/// let mapped: IpAddr = "::ffff:1.2.3.4".parse().unwrap();
/// assert_eq!(normalize_ip(mapped, 56), "1.2.3.4".parse::<IpAddr>().unwrap());
/// ```
pub fn normalize_ip(ip: IpAddr, v6_prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => IpAddr::V4(a),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(mask_v6(a, v6_prefix)),
        },
    }
}

fn mask_v6(a: Ipv6Addr, prefix: u8) -> Ipv6Addr {
    let bits = u128::from(a);
    let prefix = u32::from(prefix.min(128));
    let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
    Ipv6Addr::from(bits & mask)
}

fn mask_v4(a: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    let bits = u32::from(a);
    let prefix = u32::from(prefix.min(32));
    let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
    Ipv4Addr::from(bits & mask)
}

/// A range of IP addresses in CIDR notation (`10.0.0.0/8`, `2001:db8::/32`, or one address).
///
/// An IPv4 range also contains the IPv4-mapped IPv6 forms of its addresses.
///
/// ```
/// use tollgate::key::Cidr;
///
/// let net: Cidr = "10.0.0.0/8".parse().unwrap();
/// assert!(net.contains("10.1.2.3".parse().unwrap()));
/// assert!(net.contains("::ffff:10.1.2.3".parse().unwrap()));
/// assert!(!net.contains("11.0.0.1".parse().unwrap()));
/// assert!("10.0.0.0/33".parse::<Cidr>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// The range of `addr`'s first `prefix` bits.
    ///
    /// # Errors
    /// [`ParseError`](crate::ParseError) ([`InvalidCidr`](crate::ParseErrorKind::InvalidCidr))
    /// when `prefix` exceeds the address width (32 or 128).
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, ParseError> {
        // An IPv4-mapped range (`::ffff:10.0.0.0/104`) is the IPv4 range it maps: addresses are
        // compared in their IPv4 form, so the mapped form would otherwise match nothing.
        let (addr, prefix) = match addr {
            IpAddr::V6(a) if (96..=128).contains(&prefix) && a.to_ipv4_mapped().is_some() => {
                (a.to_ipv4_mapped().map_or(addr, IpAddr::V4), prefix - 96)
            }
            _ => (addr, prefix),
        };
        let (addr, max) = match addr {
            IpAddr::V4(a) => (IpAddr::V4(mask_v4(a, prefix)), 32),
            IpAddr::V6(a) => (IpAddr::V6(mask_v6(a, prefix)), 128),
        };
        if prefix > max {
            return Err(invalid(&format!("{addr}/{prefix}")));
        }
        Ok(Self { addr, prefix })
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether the range holds every address of its family (`0.0.0.0/0`, `::/0`).
    pub fn is_everything(&self) -> bool {
        self.prefix == 0
    }

    /// Whether `ip` lies in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4 range also holds the IPv4-mapped forms of its addresses; an IPv6 range compares
        // addresses as written.
        let ip = match (self.addr, ip) {
            (IpAddr::V4(_), IpAddr::V6(a)) => a.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            _ => ip,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(a)) => mask_v4(a, self.prefix) == net,
            (IpAddr::V6(net), IpAddr::V6(a)) => mask_v6(a, self.prefix) == net,
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The error of a CIDR range written `input` that cannot be one.
fn invalid(input: &str) -> ParseError {
    ParseError::new(input, 0, ParseErrorKind::InvalidCidr)
}

impl FromStr for Cidr {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || invalid(s);
        let s = s.trim();
        match s.split_once('/') {
            Some((a, p)) => {
                let addr: IpAddr = a.parse().map_err(|_| bad())?;
                let prefix: u8 = p.parse().map_err(|_| bad())?;
                Self::new(addr, prefix).map_err(|_| bad())
            }
            None => {
                let addr: IpAddr = s.parse().map_err(|_| bad())?;
                let prefix = if addr.is_ipv4() { 32 } else { 128 };
                Self::new(addr, prefix).map_err(|_| bad())
            }
        }
    }
}

impl From<IpAddr> for Cidr {
    fn from(addr: IpAddr) -> Self {
        let prefix = if addr.is_ipv4() { 32 } else { 128 };
        Self { addr, prefix }
    }
}

/// Parses one address as it appears in a forwarded header: `1.2.3.4`, `1.2.3.4:80`, `::1`,
/// `[::1]`, `[::1]:80`, `"[2001:db8::1]:4711"`, `fe80::1%eth0` (zone dropped). `None` for anything
/// else (`unknown`, obfuscated identifiers, garbage).
pub(crate) fn parse_node(raw: &[u8]) -> Option<IpAddr> {
    // No valid node is longer than this; refusing early bounds the work on hostile values.
    const MAX_NODE: usize = 64;
    let s = trim_ows(raw);
    let s = s
        .strip_prefix(b"\"")
        .and_then(|s| s.strip_suffix(b"\""))
        .unwrap_or(s);
    if s.is_empty() || s.len() > MAX_NODE {
        return None;
    }
    let s = std::str::from_utf8(s).ok()?;
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        // "[v6]" or "[v6]:port"
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        return strip_zone(inside).parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if let Some((a, port)) = s.rsplit_once(':') {
        // "v4:port" (an IPv6 address without brackets parsed above or is invalid)
        if is_port(port) {
            if let Ok(v4) = a.parse::<Ipv4Addr>() {
                return Some(IpAddr::V4(v4));
            }
        }
    }
    strip_zone(s).parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

fn strip_zone(s: &str) -> &str {
    s.split_once('%').map_or(s, |(a, _)| a)
}

fn is_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

/// Trims optional whitespace (spaces and tabs) on both sides.
pub(crate) fn trim_ows(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let Some(start) = start else {
        return &[];
    };
    let end = s
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |e| e + 1);
    s.get(start..end).unwrap_or(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn regression_a_mapped_range_holds_its_addresses() {
        // Found by the ip_mask fuzz target: `::ffff:10.0.0.0/104` contained nothing, not even
        // `::ffff:10.0.0.1`, so a proxy configured that way was silently never trusted.
        let range: Cidr = "::ffff:10.0.0.0/104".parse().unwrap();
        assert_eq!((range.addr(), range.prefix()), (ip("10.0.0.0"), 8));
        assert!(range.contains(ip("::ffff:10.0.0.1")));
        assert!(range.contains(ip("10.200.0.1")));
        assert!(!range.contains(ip("11.0.0.1")));
    }

    #[test]
    fn nodes_in_every_notation_parse() {
        for (raw, want) in [
            ("1.2.3.4", Some("1.2.3.4")),
            (" 1.2.3.4:8080 ", Some("1.2.3.4")),
            ("::1", Some("::1")),
            ("[::1]", Some("::1")),
            ("[2001:db8::1]:4711", Some("2001:db8::1")),
            ("\"[2001:db8::1]:4711\"", Some("2001:db8::1")),
            ("fe80::1%eth0", Some("fe80::1")),
            ("unknown", None),
            ("_hidden", None),
            ("1.2.3.4:", None),
            ("[::1]x", None),
            ("", None),
            ("1.2.3.4:99999999", None),
        ] {
            assert_eq!(parse_node(raw.as_bytes()), want.map(ip), "{raw:?}");
        }
        assert_eq!(parse_node(&[0xff, b'1']), None);
    }

    #[test]
    fn prefixes_mask_and_mapped_addresses_fold_to_ipv4() {
        assert_eq!(normalize_ip(ip("::ffff:102:304"), 56), ip("1.2.3.4"));
        assert_eq!(
            normalize_ip(ip("2001:db8::1.2.3.4"), 56),
            ip("2001:db8::"),
            "not mapped: masked as IPv6"
        );
        assert_eq!(normalize_ip(ip("2001:db8::1"), 0), ip("::"));
        assert_eq!(normalize_ip(ip("2001:db8::1"), 200), ip("2001:db8::1"));
        assert_eq!(Cidr::new(ip("10.1.2.3"), 8).unwrap().addr(), ip("10.0.0.0"));
        assert!(Cidr::new(ip("::1"), 129).is_err());
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().is_everything());
        assert!("::/0".parse::<Cidr>().unwrap().contains(ip("2001:db8::1")));
        assert!(!"::/0".parse::<Cidr>().unwrap().contains(ip("1.2.3.4")));
    }
}
