//! Fuzz target bodies, shared by the cargo-fuzz crate under `fuzz/` and by the lib's own tests
//! (every file of `src/fuzzing/corpus` replayed, and a proptest harness per target: `fuzzing/replay.rs`).
//! Compiled only under `cfg(fuzzing)` (set by cargo-fuzz) and `cfg(test)`: not part of the public
//! API, and absent from a user's build.
//!
//! Every target takes arbitrary bytes, decodes a structured input from them with [`Input`]
//! (`arbitrary`'s cursor, which never fails: missing bytes read as zero), runs the code under test
//! and asserts its invariants. A failed assertion or any panic is a finding.

#![allow(missing_docs, clippy::missing_panics_doc)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use http::{HeaderMap, HeaderName, HeaderValue, Request};

use crate::decision::Outcome;
use crate::key::{
    Cidr, ForwardedHeader, ForwardedIp, KeyExtractor, MAX_FORWARDED_ENTRIES, PeerAddr, normalize_ip,
};
use crate::quota::{MAX_PERIOD, Quota, parse_quotas};
use crate::rule::{Rule, horizon_ticks};
use crate::store::StoreKey;
use crate::strategy::{Op, Params, QuotaState, Strategy, Verdict, apply};

/// The input cursor of every target: `arbitrary`'s [`Unstructured`]. Its integers are read little
/// endian and missing bytes read as zero, so every input decodes and the checked-in corpora keep
/// their meaning.
pub type Input<'a> = Unstructured<'a>;

/// Infallible draws from an [`Input`], in the byte layout the corpora were written in.
pub trait Draw<'a> {
    /// One byte (zero past the end).
    fn u8(&mut self) -> u8;
    /// The low bit of one byte.
    fn bool(&mut self) -> bool;
    /// Two bytes, little endian.
    fn u16(&mut self) -> u16;
    /// Four bytes, little endian.
    fn u32(&mut self) -> u32;
    /// Eight bytes, little endian.
    fn u64(&mut self) -> u64;
    /// Sixteen bytes, little endian.
    fn u128(&mut self) -> u128;
    /// A byte string whose length is read first (one byte, modulo `max + 1`; shorter at the end of
    /// the input).
    fn sized(&mut self, max: usize) -> &'a [u8];
    /// Everything left.
    fn rest(&mut self) -> &'a [u8];
    /// An address that often falls in the ranges [`Draw::cidr`] builds.
    fn ip(&mut self) -> IpAddr;
    /// A CIDR range, valid by construction (any prefix up to the address width).
    fn cidr(&mut self) -> Cidr;
}

/// An integer from `u`: `arbitrary`'s integers only fail on a broken `Unstructured`, never at the
/// end of the input (they read zeros there).
fn int<'a, T: Arbitrary<'a> + Default>(u: &mut Unstructured<'a>) -> T {
    u.arbitrary().unwrap_or_default()
}

impl<'a> Draw<'a> for Unstructured<'a> {
    fn u8(&mut self) -> u8 {
        int(self)
    }

    fn bool(&mut self) -> bool {
        int::<u8>(self) & 1 == 1
    }

    fn u16(&mut self) -> u16 {
        int(self)
    }

    fn u32(&mut self) -> u32 {
        int(self)
    }

    fn u64(&mut self) -> u64 {
        int(self)
    }

    fn u128(&mut self) -> u128 {
        int(self)
    }

    fn sized(&mut self, max: usize) -> &'a [u8] {
        let n = usize::from(self.u8()) % (max + 1);
        self.bytes(n.min(self.len())).unwrap_or_default()
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::replace(self, Unstructured::new(&[])).take_rest()
    }

    fn ip(&mut self) -> IpAddr {
        const V4: [[u8; 4]; 4] = [[10, 0, 0, 0], [192, 168, 0, 0], [203, 0, 113, 0], [0; 4]];
        const V6: [u16; 3] = [0x2001, 0xfe80, 0];
        match self.u8() % 6 {
            0 => IpAddr::V4(Ipv4Addr::from(self.u32())),
            1 => IpAddr::V6(Ipv6Addr::from(self.u128())),
            2 => {
                let [a, b, _, _] = V4[usize::from(self.u8() % 4)];
                IpAddr::V4(Ipv4Addr::new(a, b, self.u8() % 4, self.u8() % 4))
            }
            3 => {
                let top = u128::from(V6[usize::from(self.u8() % 3)]) << 112;
                IpAddr::V6(Ipv6Addr::from(
                    top | (u128::from(self.u16() % 8) << 64) | u128::from(self.u8()),
                ))
            }
            4 => IpAddr::V6(Ipv4Addr::from(self.u32()).to_ipv6_mapped()),
            _ => {
                let [a, b, _, _] = V4[usize::from(self.u8() % 4)];
                IpAddr::V6(Ipv4Addr::new(a, b, 0, self.u8() % 4).to_ipv6_mapped())
            }
        }
    }

    fn cidr(&mut self) -> Cidr {
        let addr = self.ip();
        let width = if addr.is_ipv4() { 33 } else { 129 };
        let prefix = self.u8() % width;
        Cidr::new(addr, prefix).unwrap_or_else(|e| panic!("Cidr::new({addr}, {prefix}): {e}"))
    }
}

/// Replaces the bytes a header value may not hold (controls other than tab, DEL, newlines).
fn header_safe(raw: &[u8]) -> Vec<u8> {
    raw.iter()
        .map(|&b| {
            if (b < 0x20 && b != b'\t') || b == 0x7f {
                b'_'
            } else {
                b
            }
        })
        .collect()
}

fn header_map(name: &'static str, lines: &[Vec<u8>]) -> HeaderMap {
    let name = HeaderName::from_static(name);
    let mut h = HeaderMap::new();
    for l in lines {
        let v = HeaderValue::from_bytes(l).unwrap_or_else(|e| panic!("header value {l:?}: {e}"));
        h.append(name.clone(), v);
    }
    h
}

// ---------------------------------------------------------------------------------------------
// Target 1: forwarded headers and the trusted-proxy walk.
// ---------------------------------------------------------------------------------------------

/// How the reference walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// The peer is not trusted: headers ignored.
    UntrustedPeer,
    /// At an untrusted address (the client).
    Untrusted,
    /// At an entry that is not an address.
    Garbage,
    /// At the entry cap.
    Cap,
    /// Every entry was trusted, or there was no entry: the header's sender decides.
    Exhausted,
}

/// Splits a line at commas, walking from the right; for `Forwarded`, a comma inside a quoted string
/// (quotes paired from the right, afresh after every split) does not split. Right-most first.
fn ref_entries_rev(line: &[u8], quotes: bool) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut end = line.len();
    loop {
        let mut quoted = false;
        let mut cut = None;
        for i in (0..end).rev() {
            let b = line[i];
            if quotes && b == b'"' {
                quoted = !quoted;
            } else if b == b',' && !quoted {
                cut = Some(i);
                break;
            }
        }
        match cut {
            Some(i) => {
                out.push(&line[i + 1..end]);
                end = i;
            }
            None => {
                out.push(&line[..end]);
                return out;
            }
        }
    }
}

fn ref_trim(s: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = s.iter().position(|b| !is_ows(b)).unwrap_or(s.len());
    let end = s.iter().rposition(|b| !is_ows(b)).map_or(start, |e| e + 1);
    &s[start..end]
}

/// The `for` value of a `Forwarded` element: pairs split at `;` outside quotes (a pair still inside
/// a quote at the end is dropped); two `for` pairs make the element malformed.
fn ref_forwarded_for(element: &[u8]) -> Option<&[u8]> {
    let mut pairs = Vec::new();
    let mut quoted = false;
    let mut start = 0;
    for (i, &b) in element.iter().enumerate() {
        if b == b'"' {
            quoted = !quoted;
        } else if b == b';' && !quoted {
            pairs.push(&element[start..i]);
            start = i + 1;
        }
    }
    if !quoted {
        pairs.push(&element[start..]);
    }
    let mut found = None;
    for pair in pairs {
        let pair = ref_trim(pair);
        let Some(eq) = pair.iter().position(|&c| c == b'=') else {
            continue;
        };
        if ref_trim(&pair[..eq]).eq_ignore_ascii_case(b"for") {
            if found.is_some() {
                return None;
            }
            found = Some(&pair[eq + 1..]);
        }
    }
    found
}

/// A forwarded node as the header carries it: `1.2.3.4`, `1.2.3.4:80`, `::1`, `[::1]`, `[::1]:80`,
/// a quoted form of those, an IPv6 zone (dropped). Written apart from the crate's parser.
fn ref_node(raw: &[u8]) -> Option<IpAddr> {
    let mut s = ref_trim(raw);
    if s.len() >= 2 && s[0] == b'"' && s[s.len() - 1] == b'"' {
        s = &s[1..s.len() - 1];
    }
    if s.is_empty() || s.len() > 64 {
        return None;
    }
    let s = std::str::from_utf8(s).ok()?;
    let port_ok = |p: &str| (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit());
    let v6 = |a: &str| a.split('%').next().unwrap_or(a).parse::<Ipv6Addr>().ok();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(inner) = s.strip_prefix('[') {
        let close = inner.find(']')?;
        let after = &inner[close + 1..];
        let ok = after.is_empty() || after.strip_prefix(':').is_some_and(port_ok);
        return if ok {
            v6(&inner[..close]).map(IpAddr::V6)
        } else {
            None
        };
    }
    if let Some(colon) = s.rfind(':') {
        if port_ok(&s[colon + 1..]) {
            if let Ok(a) = s[..colon].parse::<Ipv4Addr>() {
                return Some(IpAddr::V4(a));
            }
        }
    }
    v6(s).map(IpAddr::V6)
}

/// The naive reference walk: split everything eagerly, then walk at most 64 entries from the right.
fn ref_resolve(
    peer: IpAddr,
    trusted: &[Cidr],
    header: ForwardedHeader,
    lines: &[Vec<u8>],
) -> (IpAddr, usize, Stop) {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return (peer, 0, Stop::UntrustedPeer);
    }
    if header == ForwardedHeader::XRealIp {
        return match lines.last() {
            None => (peer, 0, Stop::Exhausted),
            Some(l) => (ref_node(l).unwrap_or(peer), 1, Stop::Exhausted),
        };
    }
    let forwarded = header == ForwardedHeader::Forwarded;
    let entries: Vec<&[u8]> = lines
        .iter()
        .rev()
        .flat_map(|l| ref_entries_rev(l, forwarded))
        .collect();
    let mut last = peer;
    let mut examined = 0;
    for entry in entries.iter().take(MAX_FORWARDED_ENTRIES) {
        examined += 1;
        if ref_trim(entry).is_empty() {
            continue;
        }
        let node = if forwarded {
            ref_forwarded_for(entry)
        } else {
            Some(*entry)
        };
        let Some(ip) = node.and_then(ref_node) else {
            return (last, examined, Stop::Garbage);
        };
        last = ip;
        if !is_trusted(ip) {
            return (last, examined, Stop::Untrusted);
        }
    }
    if entries.len() > MAX_FORWARDED_ENTRIES {
        (last, examined, Stop::Cap)
    } else {
        (last, examined, Stop::Exhausted)
    }
}

/// Target 1: `ForwardedIp::resolve` on arbitrary header lines, peers and trusted ranges.
///
/// Asserts: no panic; at most [`MAX_FORWARDED_ENTRIES`] entries examined; an untrusted peer is its
/// own key; the result is the peer or one of the header's addresses; agreement with a naive
/// reference walk; prefix invariance (entries an attacker puts to the left of what the trusted
/// proxies appended change nothing once the walk stops inside the proxies' part); `extract` is the
/// normalised result.
pub fn forwarded(data: &[u8]) {
    let mut inp = Unstructured::new(data);
    let header = match inp.u8() % 3 {
        0 => ForwardedHeader::XForwardedFor,
        1 => ForwardedHeader::Forwarded,
        _ => ForwardedHeader::XRealIp,
    };
    let peer = inp.ip();
    let n = usize::from(inp.u8() % 5);
    let trusted: Vec<Cidr> = (0..n).map(|_| inp.cidr()).collect();
    let v6_prefix = inp.u8() % 130;
    let attacker = header_safe(inp.sized(80));
    let lines: Vec<Vec<u8>> = inp
        .rest()
        .split(|&b| b == b'\n')
        .take(16)
        .map(header_safe)
        .collect();

    let x = ForwardedIp::from_cidrs(trusted.iter().copied()).header(header);
    let name = header.name();
    let got = x.resolve(peer, &header_map(name, &lines));

    assert!(
        got.examined <= MAX_FORWARDED_ENTRIES,
        "examined {}",
        got.examined
    );
    let (want, want_examined, stop) = ref_resolve(peer, &trusted, header, &lines);
    assert_eq!(
        (got.ip, got.examined),
        (want, want_examined),
        "reference walk disagrees ({stop:?}) on {lines:?}"
    );
    if stop == Stop::UntrustedPeer {
        assert_eq!((got.ip, got.examined), (peer, 0));
    }
    if stop == Stop::Untrusted {
        assert!(!trusted.iter().any(|c| c.contains(got.ip)));
    }
    // The peer or one of the addresses in the header.
    let forwarded = header == ForwardedHeader::Forwarded;
    let mut candidates = vec![peer];
    for l in &lines {
        for e in ref_entries_rev(l, forwarded) {
            let node = if forwarded {
                ref_forwarded_for(e)
            } else {
                Some(e)
            };
            candidates.extend(node.and_then(ref_node));
        }
        candidates.extend(ref_node(l));
    }
    assert!(
        candidates.contains(&got.ip),
        "{} is neither the peer nor an entry",
        got.ip
    );

    // Prefix invariance: what the attacker sent sits left of what the proxies appended.
    if matches!(
        stop,
        Stop::Untrusted | Stop::Garbage | Stop::Cap | Stop::UntrustedPeer
    ) || (header == ForwardedHeader::XRealIp && !lines.is_empty())
    {
        let mut with_line = vec![attacker.clone()];
        with_line.extend(lines.iter().cloned());
        let r = x.resolve(peer, &header_map(name, &with_line));
        assert_eq!(
            r.ip, got.ip,
            "an attacker's extra line {attacker:?} changed the key"
        );

        let balanced = lines
            .first()
            .is_some_and(|l| !forwarded || l.iter().filter(|&&b| b == b'"').count() % 2 == 0);
        if header != ForwardedHeader::XRealIp && balanced {
            let mut joined = lines.clone();
            let mut first = attacker.clone();
            first.push(b',');
            first.extend_from_slice(&joined[0]);
            joined[0] = first;
            let r = x.resolve(peer, &header_map(name, &joined));
            assert_eq!(
                r.ip, got.ip,
                "an attacker's prefix {attacker:?} changed the key"
            );
        }
    }

    // The extractor is the normalised walk.
    let mut req = Request::new(());
    *req.headers_mut() = header_map(name, &lines);
    req.extensions_mut()
        .insert(PeerAddr::new(SocketAddr::new(peer, 4711)));
    let (parts, ()) = req.into_parts();
    let x = x.ipv6_prefix(v6_prefix);
    let key = x.extract(&parts).expect("a peer address is present");
    assert_eq!(key, normalize_ip(got.ip, v6_prefix));
}

// ---------------------------------------------------------------------------------------------
// Target 2: the quota parser.
// ---------------------------------------------------------------------------------------------

const QUOTA_WORDS: &[&str] = &[
    "/",
    " per ",
    "per",
    ";",
    ",",
    " ",
    "second",
    "seconds",
    "minute",
    "hour",
    "day",
    "s",
    "ms",
    "us",
    "µs",
    "ns",
    "m",
    "h",
    "d",
    "sec",
    "min",
    "hrs",
    "0",
    "1",
    "5",
    "30",
    "100",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "99999999999999999999",
    "316224000",
    "\t",
    "PER",
    "Second",
    "é",
    "\u{0}",
    "-",
    "+1",
    "1e3",
    "½",
];

/// Target 2: `parse_quotas` and `Quota::from_str` on arbitrary text, and `Display` round trips.
///
/// Asserts: no panic; an error's position lies within the input (on a char boundary); every parsed
/// quota has a non-zero period of at most [`MAX_PERIOD`]; `Display` parses back to the same limit
/// and period, alone and joined with `; `.
pub fn quota(data: &[u8]) {
    let mut inp = Unstructured::new(data);
    let text = match inp.u8() % 3 {
        0 => String::from_utf8_lossy(inp.rest()).into_owned(),
        1 => {
            let mut s = String::new();
            while !inp.is_empty() {
                s.push_str(QUOTA_WORDS[usize::from(inp.u8()) % QUOTA_WORDS.len()]);
            }
            s
        }
        _ => {
            // A quota built from numbers: Display must parse back.
            let limit = NonZeroU32::new(inp.u32()).unwrap_or(NonZeroU32::MIN);
            let nanos = match inp.u8() % 4 {
                0 => u64::from(inp.u16()).max(1),
                1 => u64::from(inp.u16()).max(1) * 1_000_000_000,
                2 => inp.u64() % MAX_PERIOD.as_nanos() as u64 + 1,
                _ => MAX_PERIOD.as_nanos() as u64,
            };
            let q = Quota::new(limit, Duration::from_nanos(nanos)).expect("period in range");
            let q = match NonZeroU32::new(inp.u32()) {
                Some(b) if inp.bool() => q.with_burst(b),
                _ => q,
            };
            let shown = q.to_string();
            let back: Quota = shown
                .parse()
                .unwrap_or_else(|e| panic!("{shown:?} does not parse back: {e}"));
            assert_eq!(
                (back.limit(), back.period()),
                (q.limit(), q.period()),
                "{shown}"
            );
            shown
        }
    };
    check_quota_text(&text);
}

fn check_quota_text(text: &str) {
    let single = text.parse::<Quota>();
    let many = parse_quotas(text);
    for e in [single.as_ref().err(), many.as_ref().err()]
        .into_iter()
        .flatten()
    {
        assert!(e.position() <= text.len(), "{e:?}");
        assert_eq!(e.input(), text);
        let _ = e.to_string();
    }
    if let Ok(q) = single {
        assert_eq!(
            parse_quotas(text).ok(),
            Some(vec![q]),
            "one quota, two parsers"
        );
    }
    let Ok(quotas) = many else { return };
    assert!(!quotas.is_empty());
    for q in &quotas {
        assert!(!q.period().is_zero() && q.period() <= MAX_PERIOD, "{q:?}");
        assert_eq!(q.burst(), q.limit());
        let shown = q.to_string();
        let back: Quota = shown
            .parse()
            .unwrap_or_else(|e| panic!("{shown:?} (from {text:?}) does not parse back: {e}"));
        assert_eq!(back, *q, "{text:?} -> {shown:?}");
    }
    let joined = quotas
        .iter()
        .map(Quota::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    assert_eq!(parse_quotas(&joined).as_ref(), Ok(&quotas), "{joined:?}");
}

// ---------------------------------------------------------------------------------------------
// Target 3: the IP normaliser and prefix masker.
// ---------------------------------------------------------------------------------------------

/// Target 3: `normalize_ip` and `Cidr`.
///
/// Asserts: normalising is idempotent; an IPv4-mapped address keys as its IPv4 address (also when
/// its text form is parsed), IPv4 as itself, any other IPv6 address as itself masked to the prefix
/// (never as IPv4, `2001:db8::1.2.3.4` included); two addresses sharing the prefix share the key;
/// prefixes above 128 act as 128; a range contains its own address and the mapped forms of its IPv4
/// addresses; `Cidr` text round-trips and parsing arbitrary text does not panic.
pub fn ip_mask(data: &[u8]) {
    let mut inp = Unstructured::new(data);
    let ip = inp.ip();
    let prefix = inp.u8();
    let noise = inp.u128();
    let key = normalize_ip(ip, prefix);
    assert_eq!(
        normalize_ip(key, prefix),
        key,
        "not idempotent for {ip}/{prefix}"
    );
    assert_eq!(normalize_ip(ip, prefix.min(128)), key);
    let eff = u32::from(prefix.min(128));
    let mask = u128::MAX.checked_shl(128 - eff).unwrap_or(0);
    match ip {
        IpAddr::V4(a) => assert_eq!(key, IpAddr::V4(a)),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => {
                assert_eq!(key, IpAddr::V4(v4), "mapped {a}");
                assert_eq!(normalize_ip(IpAddr::V4(v4), prefix), key);
                let text: IpAddr = a.to_string().parse().expect("Display parses");
                assert_eq!(normalize_ip(text, prefix), key);
            }
            None => {
                let IpAddr::V6(k) = key else {
                    panic!("{a} keyed as IPv4: {key}");
                };
                assert_eq!(u128::from(k), u128::from(a) & mask, "{a}/{prefix}");
                // Another address of the same prefix (not a mapped one) shares the key.
                let other = Ipv6Addr::from((u128::from(a) & mask) | (noise & !mask));
                if other.to_ipv4_mapped().is_none() {
                    assert_eq!(
                        normalize_ip(IpAddr::V6(other), prefix),
                        key,
                        "{a} vs {other}"
                    );
                }
            }
        },
    }

    let width = if ip.is_ipv4() { 32 } else { 128 };
    match Cidr::new(ip, prefix) {
        Err(_) => assert!(prefix > width),
        Ok(c) => {
            assert!(prefix <= width);
            assert!(c.contains(ip), "{c} does not contain {ip}");
            // A range written in the IPv4-mapped form with at least the 96 mapping bits is the
            // IPv4 range it maps (addresses are compared in IPv4 form).
            let mapped =
                matches!(ip, IpAddr::V6(a) if a.to_ipv4_mapped().is_some()) && prefix >= 96;
            let prefix = if mapped { prefix - 96 } else { prefix };
            assert_eq!(c.prefix(), prefix);
            assert_eq!(c.is_everything(), prefix == 0);
            if let IpAddr::V4(a) = ip {
                assert!(c.contains(IpAddr::V6(a.to_ipv6_mapped())));
            }
            let shown = c.to_string();
            assert_eq!(shown.parse::<Cidr>(), Ok(c), "{shown}");
            // The network address is masked: re-creating the range changes nothing.
            assert_eq!(Cidr::new(c.addr(), prefix), Ok(c));
        }
    }
    let text = String::from_utf8_lossy(inp.rest());
    if let Ok(c) = text.parse::<Cidr>() {
        let shown = c.to_string();
        assert_eq!(shown.parse::<Cidr>(), Ok(c), "{text:?} -> {shown}");
        let mapped = matches!(c.addr(), IpAddr::V6(a) if a.to_ipv4_mapped().is_some());
        assert!(mapped || c.contains(c.addr()), "{c}");
    }
}

// ---------------------------------------------------------------------------------------------
// Target 4: the strategy step functions.
// ---------------------------------------------------------------------------------------------

/// The largest moving-window limit the target builds (the log costs one word per unit).
const FUZZ_MOVING_LIMIT: u32 = 4096;

fn fuzz_quota(inp: &mut Input<'_>, strategy: Strategy) -> Option<Quota> {
    let mut limit = match inp.u8() % 4 {
        0 => u32::from(inp.u8() % 10) + 1,
        1 => u32::from(inp.u16() % 1000) + 1,
        2 => inp.u32().max(1),
        _ => u32::MAX,
    };
    if strategy == Strategy::MovingWindow {
        limit = (limit - 1) % FUZZ_MOVING_LIMIT + 1;
    }
    let nanos = match inp.u8() % 5 {
        0 => u64::from(inp.u16()).max(1),
        1 => (u64::from(inp.u8()) + 1) * 1_000_000_000,
        2 => (u64::from(inp.u8() % 24) + 1) * 3_600_000_000_000,
        3 => inp.u64() % MAX_PERIOD.as_nanos() as u64 + 1,
        _ => MAX_PERIOD.as_nanos() as u64,
    };
    let q = Quota::new(NonZeroU32::new(limit)?, Duration::from_nanos(nanos)).ok()?;
    Some(match inp.u8() % 3 {
        0 => q.with_burst(NonZeroU32::new(u32::from(inp.u8()) + 1)?),
        1 => q.with_burst(NonZeroU32::new(inp.u32())?),
        _ => q,
    })
}

fn fuzz_cost(inp: &mut Input<'_>, params: &[Params]) -> u32 {
    let lim = params.first().map_or(1, |p| p.limit.max(p.burst));
    match inp.u8() % 5 {
        0 => 0,
        1 => 1,
        2 => u32::from(inp.u8() % 8),
        3 => u32::try_from(u64::from(inp.u32()) % (lim + 2)).unwrap_or(u32::MAX),
        _ => inp.u32(),
    }
}

fn limit_of(strategy: Strategy, p: &Params) -> u64 {
    if strategy.is_bucket() {
        p.burst
    } else {
        p.limit
    }
}

fn peek(
    states: &[QuotaState],
    strategy: Strategy,
    params: &[Params],
    now: u64,
) -> (usize, Verdict) {
    let mut s = states.to_vec();
    apply(&mut s, strategy, params, now, Op::Peek)
}

/// Target 4: `strategy::apply` on states produced by arbitrary traces (checks, peeks, refunds,
/// resets; time standing still, creeping, leaping or going back; up to three quotas).
///
/// Asserts per verdict: the reported quota exists and reports its own limit (the burst for the
/// buckets); `remaining <= limit`; `reset_after` within the strategy's horizon; a rejection waits
/// more than zero and at most the horizon; "never" exactly when the cost exceeds some quota's limit;
/// a rejection changes no state (peeks before and after agree); after an admission a peek at the
/// same instant reports the same `remaining`; on a forward-only clock a request retried after its
/// `retry_after` is admitted; the moving window and the clock-aligned fixed window never admit more
/// than `N` in a window.
pub fn strategy(data: &[u8]) {
    let mut inp = Unstructured::new(data);
    let strategy = Strategy::ALL[usize::from(inp.u8()) % Strategy::ALL.len()];
    let nq = usize::from(inp.u8() % 3) + 1;
    let Some(quotas) = (0..nq)
        .map(|_| fuzz_quota(&mut inp, strategy))
        .collect::<Option<Vec<_>>>()
    else {
        return;
    };
    let Ok(rule) = Rule::new(strategy, quotas) else {
        return;
    };
    let params = rule.nanos().to_vec();
    let horizons: Vec<u64> = params.iter().map(|p| horizon_ticks(strategy, p)).collect();
    let max_horizon = horizons.iter().copied().max().unwrap_or(0);
    let mut now = match inp.u8() % 4 {
        0 => 0,
        1 => 1_700_000_000_000_000_000 + u64::from(inp.u32()),
        2 => u64::MAX - u64::from(inp.u32()),
        _ => inp.u64(),
    };
    let mut states = vec![QuotaState::new(strategy); params.len()];
    // Forward-only so far, and no refund or reset: the exact-count checks apply.
    let mut monotone = true;
    let mut plain = true;
    let mut latest = now;
    let mut admitted: Vec<(u64, u64)> = Vec::new();

    for _ in 0..64 {
        if inp.is_empty() {
            break;
        }
        now = match inp.u8() % 6 {
            0 => now,
            1 => now.saturating_add(u64::from(inp.u16())),
            2 => now.saturating_add(u64::from(inp.u32()) * 1000),
            3 => now.saturating_add(params[0].window / (u64::from(inp.u8() % 8) + 1)),
            4 => now.saturating_sub(u64::from(inp.u32())),
            _ => inp.u64(),
        };
        if now < latest {
            monotone = false;
        }
        latest = latest.max(now);
        let op = match inp.u8() % 8 {
            0 => Op::Peek,
            1 => Op::Settle {
                reserved: fuzz_cost(&mut inp, &params),
                actual: 0,
                at: now,
                bound: 0,
            },
            2 => Op::Reset,
            _ => Op::Check(fuzz_cost(&mut inp, &params)),
        };
        if matches!(op, Op::Settle { .. } | Op::Reset) {
            plain = false;
        }
        let before = states.clone();
        let (i, v) = apply(&mut states, strategy, &params, now, op);
        let cost = match op {
            Op::Check(c) => u64::from(c),
            _ => 0,
        };
        let ctx = || format!("{strategy} {params:?} now={now} {op:?} -> ({i}, {v:?})");
        let p = params
            .get(i)
            .unwrap_or_else(|| panic!("no quota {i}: {}", ctx()));
        let lim = limit_of(strategy, p);
        assert_eq!(v.limit, lim, "{}", ctx());
        assert!(v.remaining <= v.limit, "{}", ctx());
        assert!(
            v.reset_after <= horizons[i],
            "reset beyond the horizon: {}",
            ctx()
        );
        let never = params.iter().any(|q| cost > limit_of(strategy, q));
        assert_eq!(v.outcome == Outcome::Exceeds, never, "{}", ctx());
        match v.outcome {
            Outcome::Allowed => {
                assert_eq!(v.retry_after, 0, "{}", ctx());
                if cost > 0 {
                    let (_, pv) = peek(&states, strategy, &params, now);
                    assert_eq!(
                        (pv.outcome, pv.remaining),
                        (Outcome::Allowed, v.remaining),
                        "peek after admission: {}",
                        ctx()
                    );
                    admitted.push((now, cost));
                }
            }
            Outcome::Rejected => {
                assert!(
                    v.retry_after > 0 && v.retry_after <= horizons[i],
                    "retry_after: {}",
                    ctx()
                );
                assert_eq!(
                    peek(&before, strategy, &params, now),
                    peek(&states, strategy, &params, now),
                    "a rejection changed the state: {}",
                    ctx()
                );
                if monotone && now <= u64::MAX / 4 - max_horizon.saturating_mul(4) {
                    let mut later = states.clone();
                    let (_, w) = apply(&mut later, strategy, &params, now + v.retry_after, op);
                    assert_eq!(
                        w.outcome,
                        Outcome::Allowed,
                        "retry after the wait: {} -> {w:?}",
                        ctx()
                    );
                }
            }
            Outcome::Exceeds => {}
        }
        // Exact counts for the exact strategies on a forward-only clock.
        if monotone && plain && params.len() == 1 && v.outcome == Outcome::Allowed && cost > 0 {
            let p = &params[0];
            let in_window: u64 = match strategy {
                Strategy::MovingWindow => admitted
                    .iter()
                    .filter(|(t, _)| now - t < p.window)
                    .map(|(_, c)| c)
                    .sum(),
                Strategy::FixedWindow => admitted
                    .iter()
                    .filter(|(t, _)| t / p.window == now / p.window)
                    .map(|(_, c)| c)
                    .sum(),
                _ => 0,
            };
            assert!(
                in_window <= p.limit,
                "{in_window} admitted in one window: {}",
                ctx()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Target 5: Redis reply decoding.
// ---------------------------------------------------------------------------------------------

#[cfg(feature = "redis")]
fn redis_value(inp: &mut Input<'_>, depth: u8) -> ::redis::Value {
    use ::redis::{PushKind, Value, VerbatimFormat};
    let leaf = depth >= 4;
    let children = |inp: &mut Input<'_>| -> Vec<Value> {
        if leaf {
            return Vec::new();
        }
        let n = usize::from(inp.u8() % 8);
        (0..n).map(|_| redis_value(inp, depth + 1)).collect()
    };
    match inp.u8() % 16 {
        0 => Value::Nil,
        1..=4 => Value::Int(match inp.u8() % 4 {
            0 => i64::from(inp.u8() % 4),
            1 => i64::from(inp.u32()),
            2 => -i64::from(inp.u8()),
            _ => inp.u64() as i64,
        }),
        5 => Value::BulkString(inp.sized(16).to_vec()),
        6 => Value::Array(children(inp)),
        7 => Value::SimpleString(String::from_utf8_lossy(inp.sized(16)).into_owned()),
        8 => Value::Okay,
        9 => {
            let kv = children(inp);
            let vs = children(inp);
            Value::Map(kv.into_iter().zip(vs).collect())
        }
        10 => Value::Set(children(inp)),
        11 => Value::Double(f64::from_bits(inp.u64())),
        12 => Value::Boolean(inp.bool()),
        13 => Value::VerbatimString {
            format: VerbatimFormat::Text,
            text: String::from_utf8_lossy(inp.sized(16)).into_owned(),
        },
        14 => Value::Push {
            kind: PushKind::Message,
            data: children(inp),
        },
        _ => Value::Attribute {
            data: Box::new(redis_value(inp, depth.saturating_add(1).min(4))),
            attributes: Vec::new(),
        },
    }
}

/// Target 5: decoding a script reply from arbitrary `redis::Value` trees (feature `redis`).
///
/// Half the inputs are replies of the right shape (`now`, then five integers per quota) with
/// arbitrary integers, the others arbitrary trees. Asserts: no panic; an error is a
/// [`BadReply`](crate::StoreErrorKind::BadReply); a decision names an existing quota and has
/// `remaining <= limit` and a `retry_after` only when rejected; a reply of the wrong length is refused.
#[cfg(feature = "redis")]
pub fn redis_reply(data: &[u8]) {
    use ::redis::Value;
    let mut inp = Unstructured::new(data);
    let quotas = usize::from(inp.u8() % 18);
    let value = if inp.bool() {
        let mut items = vec![Value::Int(inp.u64() as i64 & i64::MAX)];
        for _ in 0..5 * quotas {
            items.push(match inp.u8() % 8 {
                0 => redis_value(&mut inp, 3),
                1 => Value::Int(-1),
                2 => Value::Int(i64::MAX),
                3 | 4 => Value::Int(i64::from(inp.u8() % 4)),
                _ => Value::Int(i64::from(inp.u32())),
            });
        }
        if inp.u8() % 8 == 0 {
            items.pop();
        }
        Value::Array(items)
    } else {
        redis_value(&mut inp, 0)
    };
    let well_formed = matches!(&value, Value::Array(items) if items.len() == 1 + 5 * quotas);
    match crate::store::redis::fuzz_decode(&value, quotas) {
        Err(e) => assert_eq!(e.kind(), crate::StoreErrorKind::BadReply, "{e}"),
        Ok(d) => {
            assert!(well_formed && quotas > 0, "decoded {value:?}");
            assert!(d.quota_index() < quotas);
            assert!(d.remaining() <= d.limit());
            assert_eq!(d.retry_after().is_some(), d.outcome() == Outcome::Rejected);
        }
    }
}

/// Without the `redis` feature there is no reply decoder to fuzz.
#[cfg(not(feature = "redis"))]
pub fn redis_reply(data: &[u8]) {
    let _ = data;
}

// ---------------------------------------------------------------------------------------------
// Target 6: key encodings.
// ---------------------------------------------------------------------------------------------

fn encoding<K: StoreKey>(k: &K) -> Vec<u8> {
    let mut v = Vec::new();
    k.encode(&mut v);
    v
}

/// Asserts that `a` and `b` encode alike exactly when equal, and (feature `redis`) that their Redis
/// key names do too, each logical key's names sharing one hash tag.
fn injective<K: StoreKey + std::fmt::Debug>(prefix: &str, a: &K, b: &K) {
    assert_eq!(encoding(a) == encoding(b), a == b, "{a:?} vs {b:?}");
    #[cfg(feature = "redis")]
    redis_names(prefix, a, b);
    #[cfg(not(feature = "redis"))]
    let _ = prefix;
}

/// The Cluster hash tag of a key name: the bytes between the first `{` and the next `}`, if any.
#[cfg(feature = "redis")]
fn hash_tag(name: &str) -> Option<&str> {
    let open = name.find('{')?;
    let close = name[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| &name[open + 1..close])
}

/// The Cluster slot of a key name: CRC16/XMODEM (the `crc16` crate) of its hash tag, or of the
/// whole name without one, mod 16384.
#[cfg(feature = "redis")]
fn slot(name: &str) -> u16 {
    let bytes = hash_tag(name).unwrap_or(name).as_bytes();
    crc16::State::<crc16::XMODEM>::calculate(bytes) % 16384
}

#[cfg(feature = "redis")]
fn redis_names<K: StoreKey + std::fmt::Debug>(prefix: &str, a: &K, b: &K) {
    for strategy in [Strategy::MovingWindow, Strategy::SlidingWindow] {
        let na = crate::store::redis::fuzz_key_names(prefix, a, strategy, u64::MAX, 3);
        let nb = crate::store::redis::fuzz_key_names(prefix, b, strategy, u64::MAX, 3);
        for names in [&na, &nb] {
            let tag = hash_tag(&names[0]).expect("every name has a hash tag");
            for n in names.iter() {
                assert!(n.starts_with(prefix), "{n}");
                assert_eq!(hash_tag(n), Some(tag), "{names:?}");
                assert_eq!(slot(n), slot(&names[0]));
                assert!(
                    n.len() <= prefix.len() + 2 + 2 * 48 + 2 + 19,
                    "{n} is too long"
                );
            }
        }
        let same_tag = hash_tag(&na[0]) == hash_tag(&nb[0]);
        assert_eq!(same_tag, a == b, "{a:?} vs {b:?}: {na:?} {nb:?}");
        assert_eq!(na == nb, a == b);
    }
}

/// A prefix the Redis store accepts (no brace, at most 64 bytes).
fn fuzz_prefix(inp: &mut Input<'_>) -> String {
    String::from_utf8_lossy(inp.sized(24)).replace(['{', '}'], "")
}

/// Moves `k` bytes from the front of `b` to the end of `a` (separator injection).
fn shift(a: &[u8], b: &[u8], k: usize) -> (Vec<u8>, Vec<u8>) {
    let k = k.min(b.len());
    let mut a2 = a.to_vec();
    a2.extend_from_slice(&b[..k]);
    (a2, b[k..].to_vec())
}

/// Target 6: `StoreKey` encodings and Redis key names on pairs of keys: equal encodings (and names)
/// exactly for equal keys, whatever bytes the keys hold (separators, braces, NUL, non-UTF-8, long
/// keys that get hashed); one hash tag, so one Cluster slot, for all names of one key.
pub fn key_encoding(data: &[u8]) {
    let mut inp = Unstructured::new(data);
    let prefix = fuzz_prefix(&mut inp);
    let kind = inp.u8() % 6;
    let k = usize::from(inp.u8());
    let a1 = inp.sized(120);
    let a2 = inp.sized(40);
    let b1 = inp.sized(120);
    let b2 = inp.sized(40);
    // The second key: an independent one, or the first with bytes moved between its parts.
    let (b1, b2) = if inp.bool() {
        (b1.to_vec(), b2.to_vec())
    } else {
        shift(a1, a2, k)
    };
    let s = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
    match kind {
        0 => injective(&prefix, &a1.to_vec(), &b1),
        1 => injective(&prefix, &(s(a1), s(a2)), &(s(&b1), s(&b2))),
        2 => injective(&prefix, &(a1.to_vec(), a2.to_vec()), &(b1, b2)),
        3 => {
            let (ia, ib) = (inp.ip(), inp.ip());
            injective(&prefix, &ia, &ib);
            injective(&prefix, &(ia, s(a1)), &(ib, s(&b1)));
        }
        4 => injective(
            &prefix,
            &(s(a1), s(a2), u64::from(inp.u8() % 2)),
            &(s(&b1), s(&b2), u64::from(inp.u8() % 2)),
        ),
        _ => injective(
            &prefix,
            &(a1.to_vec(), (), a2.to_vec(), u32::from(inp.u8() % 2)),
            &(b1, (), b2, u32::from(inp.u8() % 2)),
        ),
    }
}

#[cfg(test)]
mod replay;
