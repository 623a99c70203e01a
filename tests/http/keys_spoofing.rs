//! Key extraction and spoofing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::request::Parts;
use http::{HeaderValue, Request};
use proptest::prelude::*;
use tollgate::key::{
    ExtensionKey, ForwardedHeader, ForwardedIp, HeaderKey, KeyExtractor, PeerAddr, PeerIp,
    ValueKey, normalize_ip,
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A request head from `peer` with the given header lines (raw bytes).
fn parts(peer: IpAddr, headers: &[(&str, &[u8])]) -> Parts {
    let mut b = Request::builder();
    for (name, value) in headers {
        b = b.header(*name, HeaderValue::from_bytes(value).unwrap());
    }
    let mut req = b.body(()).unwrap();
    req.extensions_mut()
        .insert(PeerAddr::new(SocketAddr::new(peer, 4000)));
    req.into_parts().0
}

fn proxies() -> ForwardedIp {
    ForwardedIp::new(["10.0.0.0/8", "192.168.0.0/16", "fd00::/8"]).unwrap()
}

#[test]
fn xff_table() {
    let x = proxies();
    let peer = ip("10.0.0.1");
    let cases: &[(&[&[u8]], &str)] = &[
        (&[b"203.0.113.7"], "203.0.113.7"),
        (&[b"6.6.6.6, 203.0.113.7, 10.1.1.1"], "203.0.113.7"),
        // Several field lines are joined in order (HAProxy appends a new line).
        (&[b"6.6.6.6", b"203.0.113.7", b"10.1.1.1"], "203.0.113.7"),
        (&[b"6.6.6.6, 203.0.113.7:8443"], "203.0.113.7"),
        (&[b"[2001:db8::1]:8443"], "2001:db8::"),
        (&[b"6.6.6.6,,203.0.113.7, ,10.2.2.2"], "203.0.113.7"),
        (&[b"6.6.6.6, ::ffff:203.0.113.7"], "203.0.113.7"),
        (&[b"fe80::1%eth0"], "fe80::"),
        // Garbage appended by a trusted hop stops the walk at that hop.
        (&[b"6.6.6.6, unknown, 10.3.3.3"], "10.3.3.3"),
        (&[b"6.6.6.6, garbage"], "10.0.0.1"),
        // All trusted: the left-most examined (an internal client).
        (&[b"192.168.1.1, 10.3.3.3"], "192.168.1.1"),
        (&[], "10.0.0.1"),
    ];
    for (lines, want) in cases {
        let headers: Vec<(&str, &[u8])> = lines.iter().map(|l| ("x-forwarded-for", *l)).collect();
        assert_eq!(
            x.extract(&parts(peer, &headers)).unwrap(),
            ip(want),
            "{lines:?}"
        );
    }
}

#[test]
fn forwarded_table() {
    let x = proxies().header(ForwardedHeader::Forwarded);
    let peer = ip("10.0.0.1");
    let cases: &[(&[u8], &str)] = &[
        (b"for=203.0.113.7", "203.0.113.7"),
        (b"for=\"[2001:db8::1]:4711\"", "2001:db8::"),
        (b"For=6.6.6.6, FOR=203.0.113.7;proto=https", "203.0.113.7"),
        (
            b"for=6.6.6.6, for=203.0.113.7;by=\"a,b;c\", for=10.1.1.1",
            "203.0.113.7",
        ),
        (b"for=6.6.6.6, for=unknown", "10.0.0.1"),
        (b"for=6.6.6.6, for=_hidden, for=10.4.4.4", "10.4.4.4"),
        (b"proto=https", "10.0.0.1"),
        (b"for=\"203.0.113.7:80\"", "203.0.113.7"),
    ];
    for (value, want) in cases {
        let got = x.extract(&parts(peer, &[("forwarded", value)])).unwrap();
        assert_eq!(got, ip(want), "{}", String::from_utf8_lossy(value));
    }
}

/// Only the configured header is read; the others never are.
#[test]
fn one_source_of_truth() {
    let peer = ip("10.0.0.1");
    let headers: &[(&str, &[u8])] = &[
        ("x-forwarded-for", b"1.1.1.1"),
        ("forwarded", b"for=2.2.2.2"),
        ("x-real-ip", b"3.3.3.3"),
    ];
    let h = parts(peer, headers);
    assert_eq!(proxies().extract(&h).unwrap(), ip("1.1.1.1"));
    let fwd = proxies().header(ForwardedHeader::Forwarded);
    assert_eq!(fwd.extract(&h).unwrap(), ip("2.2.2.2"));
    let real = proxies().header(ForwardedHeader::XRealIp);
    assert_eq!(real.extract(&h).unwrap(), ip("3.3.3.3"));
    // A bad value in the configured header never falls through to another header.
    let h = parts(
        peer,
        &[("x-real-ip", b"nonsense"), ("x-forwarded-for", b"1.1.1.1")],
    );
    assert_eq!(real.extract(&h).unwrap(), peer);
    // PeerIp reads no header at all.
    assert_eq!(
        PeerIp::default()
            .extract(&parts(ip("198.51.100.4"), headers))
            .unwrap(),
        ip("198.51.100.4")
    );
}

/// IPv6 prefixes and mapped IPv4.
#[test]
fn ipv6_prefixes_and_mapped_ipv4() {
    let key = |s: &str| PeerIp::default().extract(&parts(ip(s), &[])).unwrap();
    // 2^16 addresses of one /56 -> one key.
    let base = u128::from(ip_v6("2001:db8:aa:bb00::"));
    let mut keys = std::collections::HashSet::new();
    for i in 0u128..(1 << 16) {
        // Spread the 16 bits over the host part and the /64s inside the /56.
        let addr =
            base | ((i & 0xff) << 64) | ((i >> 8) << 8) | i.wrapping_mul(0x9e37_79b9) & 0xffff_0000;
        keys.insert(
            PeerIp::default()
                .extract(&parts(IpAddr::V6(Ipv6Addr::from(addr)), &[]))
                .unwrap(),
        );
    }
    assert_eq!(keys.len(), 1, "one /56, one bucket");
    assert_eq!(
        key("2001:db8:aa:bb01::1"),
        key("2001:db8:aa:bbff::2"),
        "two /64s in one /56"
    );
    assert_ne!(
        key("2001:db8:aa:bb00::1"),
        key("2001:db8:aa:bc00::1"),
        "two /56s"
    );
    let by64 = PeerIp::default().ipv6_prefix(64);
    assert_ne!(
        by64.extract(&parts(ip("2001:db8:aa:bb01::1"), &[]))
            .unwrap(),
        by64.extract(&parts(ip("2001:db8:aa:bb02::1"), &[]))
            .unwrap(),
        "the /64 option"
    );
    for mapped in ["::ffff:1.2.3.4", "::ffff:102:304", "1.2.3.4"] {
        assert_eq!(key(mapped), ip("1.2.3.4"), "{mapped}");
    }
    assert_eq!(key("2001:db8::1.2.3.4"), ip("2001:db8::"), "IPv6, not IPv4");
    assert_ne!(key("1.2.3.4"), key("1.2.3.5"), "IPv4 keyed by /32");
    assert_eq!(normalize_ip(ip("fe80::1"), 56), ip("fe80::"));
}

fn ip_v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// Malformed, control and non-UTF-8 bytes in every header an extractor reads.
#[test]
fn malformed_values_follow_the_documented_rule() {
    let peer = ip("10.0.0.1");
    let bad: &[&[u8]] = &[
        b"\x80\xff",
        b"1.2.3.4\tx",
        b"x",
        b"999.1.1.1",
        b"[::1",
        b"\"",
        b"for=\"",
        b";;,,",
    ];
    for v in bad {
        for h in [
            ForwardedHeader::XForwardedFor,
            ForwardedHeader::Forwarded,
            ForwardedHeader::XRealIp,
        ] {
            let x = proxies().header(h);
            let got = x.extract(&parts(peer, &[(h.name(), v)])).unwrap();
            assert_eq!(
                got, peer,
                "{h:?} {v:?}: invalid means no client beyond the proxy"
            );
        }
        let k = HeaderKey::new("x-api-key").extract(&parts(peer, &[("x-api-key", v)]));
        assert!(k.is_ok(), "any non-empty bytes are a key: {v:?}");
    }
    let untrusted = ip("198.51.100.9");
    assert_eq!(
        proxies()
            .extract(&parts(untrusted, &[("x-forwarded-for", b"\x80")]))
            .unwrap(),
        untrusted
    );
    // No peer address at all: a key error, not a panic.
    let no_peer = Request::builder().body(()).unwrap().into_parts().0;
    assert!(PeerIp::default().extract(&no_peer).is_err());
    assert!(proxies().extract(&no_peer).is_err());
}

/// A 1 MiB X-Forwarded-For of 10^5 entries gives the right answer (the work is bounded by
/// `ForwardedIp::MAX_ENTRIES`, counted in the extractor's own tests); a 64 KiB API key becomes a
/// fixed-size key.
#[test]
fn oversized_headers_take_bounded_work() {
    let x = proxies();
    let mut xff = String::with_capacity(1 << 20);
    while xff.len() < (1 << 20) - 32 {
        xff.push_str("10.9.9.9, ");
    }
    xff.push_str("10.1.2.3");
    let entries = xff.split(',').count();
    assert!(entries > 100_000 && xff.len() > 1_000_000, "{entries}");
    let got = x
        .extract(&parts(
            ip("10.0.0.1"),
            &[("x-forwarded-for", xff.as_bytes())],
        ))
        .unwrap();
    assert_eq!(got, ip("10.9.9.9"), "all trusted: the left-most examined");
    let attack = format!("{}203.0.113.7, 10.1.1.1", "6.6.6.6, ".repeat(100_000));
    let got = x
        .extract(&parts(
            ip("10.0.0.1"),
            &[("x-forwarded-for", attack.as_bytes())],
        ))
        .unwrap();
    assert_eq!(got, ip("203.0.113.7"));
    let key = vec![b'k'; 64 * 1024];
    let k = HeaderKey::new("x-api-key")
        .extract(&parts(ip("10.0.0.1"), &[("x-api-key", &key)]))
        .unwrap();
    assert_eq!(k.as_bytes().len(), 33);
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct User(ValueKey);

impl tollgate::store::StoreKey for User {
    fn encode(&self, out: &mut Vec<u8>) {
        self.0.encode(out);
    }
}

/// IP + username, normalised, length-prefixed, fixed-size for huge names.
#[test]
fn composite_ip_and_username() {
    let x = (PeerIp::default(), ExtensionKey::<User>::new());
    let with = |peer: &str, name: &str| {
        let mut p = parts(ip(peer), &[]);
        p.extensions.insert(User(ValueKey::username(name)));
        x.extract(&p).unwrap()
    };
    assert_eq!(with("1.2.3.4", "Alice"), with("1.2.3.4", " alice "));
    assert_ne!(with("1.2.3.4", "alice"), with("1.2.3.5", "alice"));
    assert_ne!(with("1.2.3.4", "alice"), with("1.2.3.4", "bob"));
    let huge = "x".repeat(10_000);
    let mut enc = Vec::new();
    tollgate::store::StoreKey::encode(&with("1.2.3.4", &huge), &mut enc);
    assert!(enc.len() <= 4 + 4 + 4 + 33, "{}", enc.len());
    let mut p = parts(ip("1.2.3.4"), &[]);
    p.extensions.insert(7u8);
    assert!(x.extract(&p).is_err(), "a missing part is a missing key");
}

/// An attacker-chosen entry: addresses (trusted-looking too), ports, garbage, `unknown`,
/// obfuscated identifiers, empty entries.
fn junk() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(|a| Ipv4Addr::from(a).to_string()),
        any::<[u8; 4]>().prop_map(|a| format!("{}:{}", Ipv4Addr::from(a), a[0])),
        any::<u128>().prop_map(|a| format!("[{}]:443", Ipv6Addr::from(a))),
        any::<u128>().prop_map(|a| Ipv6Addr::from(a).to_string()),
        Just("10.0.0.5".to_owned()),
        Just("unknown".to_owned()),
        Just("_obfuscated".to_owned()),
        Just(String::new()),
        "[ -~]{0,12}".prop_map(|s| s.replace(',', "")),
    ]
}

fn client_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        (1u8..=9, any::<[u8; 3]>())
            .prop_map(|(a, r)| IpAddr::V4(Ipv4Addr::new(a, r[0], r[1], r[2]))),
        any::<u64>()
            .prop_map(|h| IpAddr::V6(Ipv6Addr::from((0x2001_0db8u128 << 96) | u128::from(h)))),
    ]
}

fn trusted_hop() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 3]>().prop_map(|r| IpAddr::V4(Ipv4Addr::new(10, r[0], r[1], r[2]))),
        any::<u64>().prop_map(|h| IpAddr::V6(Ipv6Addr::from((0xfd00u128 << 112) | u128::from(h)))),
    ]
}

fn render(ip: IpAddr, forwarded: bool) -> String {
    match (ip, forwarded) {
        (IpAddr::V6(a), true) => format!("for=\"[{a}]\""),
        (a, true) => format!("for={a}"),
        (a, false) => a.to_string(),
    }
}

/// Splits `entries` into header lines at the given cut points.
fn lines(entries: &[String], cuts: &[usize]) -> Vec<String> {
    let mut out = Vec::new();
    let mut start = 0;
    for &c in cuts {
        let c = c % (entries.len() + 1);
        if c > start {
            out.push(entries[start..c].join(", "));
            start = c;
        }
    }
    if start < entries.len() || out.is_empty() {
        out.push(entries[start..].join(", "));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

    /// Key(P ++ S) == key(S) for any attacker prefix P and the suffix S trusted proxies
    /// append (client then hops), in both list headers and any split into field lines; and from an
    /// untrusted peer, key(any headers) == key(no headers).
    #[test]
    fn prefix_invariance(
        prefix in prop::collection::vec(junk(), 0..8),
        client in client_ip(),
        hops in prop::collection::vec(trusted_hop(), 0..4),
        forwarded in any::<bool>(),
        cuts in prop::collection::vec(0usize..16, 0..3),
        untrusted_peer in any::<[u8; 4]>(),
    ) {
        let header = if forwarded { ForwardedHeader::Forwarded } else { ForwardedHeader::XForwardedFor };
        let x = proxies().header(header);
        let peer = ip("10.0.0.1");
        let suffix: Vec<String> = std::iter::once(client).chain(hops.iter().copied()).map(|a| render(a, forwarded)).collect();
        let attacked: Vec<String> = prefix
            .iter()
            .map(|j| if forwarded { format!("for=\"{}\"", j.replace(['"', '\\'], "")) } else { j.clone() })
            .chain(suffix.iter().cloned())
            .collect();
        let key_of = |entries: &[String]| {
            let ls = lines(entries, &cuts);
            let hs: Vec<(&str, &[u8])> = ls.iter().map(|l| (header.name(), l.as_bytes())).collect();
            x.extract(&parts(peer, &hs)).unwrap()
        };
        let honest = key_of(&suffix);
        prop_assert_eq!(honest, normalize_ip(client, 56));
        prop_assert_eq!(key_of(&attacked), honest);

        let outsider = IpAddr::V4(Ipv4Addr::new(11, untrusted_peer[1], untrusted_peer[2], untrusted_peer[3]));
        let ls = lines(&attacked, &cuts);
        let mut hs: Vec<(&str, &[u8])> = ls.iter().map(|l| (header.name(), l.as_bytes())).collect();
        hs.push(("x-real-ip", b"1.2.3.4"));
        prop_assert_eq!(x.extract(&parts(outsider, &hs)).unwrap(), outsider);
        prop_assert_eq!(x.extract(&parts(outsider, &[])).unwrap(), outsider);
    }

    /// Arbitrary bytes in every forwarded header: no panic, and the answer is the peer or an
    /// address that appears in the header.
    #[test]
    fn arbitrary_forwarded_bytes(value in prop::collection::vec(any::<u8>(), 0..200), which in 0usize..3) {
        let header = [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded, ForwardedHeader::XRealIp][which];
        if let Ok(v) = HeaderValue::from_bytes(&value) {
            let x = proxies().header(header).ipv6_prefix(128);
            let peer = ip("10.0.0.1");
            let got = x.extract(&parts(peer, &[(header.name(), v.as_bytes())])).unwrap();
            let text = String::from_utf8_lossy(&value).to_lowercase();
            prop_assert!(got == peer || got.is_ipv4() || text.contains(':'), "{} from {:?}", got, text);
        }
    }
}
