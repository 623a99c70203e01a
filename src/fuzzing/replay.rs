//! The fuzz targets in every test run: each checked-in corpus file (`src/fuzzing/corpus/<target>/`)
//! replayed through its target, and a proptest harness per target (the same bodies `cargo fuzz`
//! runs).
//!
//! The longer tier is `scripts/fuzz.sh` (cargo-fuzz, 30 minutes per target by default).

use std::path::PathBuf;

use proptest::prelude::*;

use crate::fuzzing;

type Target = fn(&[u8]);

const TARGETS: &[(&str, Target)] = &[
    ("forwarded", fuzzing::forwarded),
    ("quota", fuzzing::quota),
    ("ip_mask", fuzzing::ip_mask),
    ("strategy", fuzzing::strategy),
    ("redis_reply", fuzzing::redis_reply),
    ("key_encoding", fuzzing::key_encoding),
];

fn corpus_files(target: &str) -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("src/fuzzing/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_file_replays_clean() {
    let mut total = 0;
    for &(name, target) in TARGETS {
        let files = corpus_files(name);
        assert!(
            files.len() >= 5,
            "corpus of {name} has only {} files",
            files.len()
        );
        for f in files {
            let data = std::fs::read(&f).expect("corpus file");
            let r = std::panic::catch_unwind(|| target(&data));
            assert!(r.is_ok(), "{name}: {} fails", f.display());
            total += 1;
        }
    }
    assert!(total >= 100, "only {total} corpus files");
}

fn config() -> ProptestConfig {
    ProptestConfig {
        // PROPTEST_CASES scales it in the longer tier (scripts/test.sh).
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// One address in the layout `Input::ip` reads: a pool IPv4 (10/8, 192.168/16, ...), any IPv4, a
/// pool IPv6, or an IPv4-mapped pool address.
fn ip_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (0u8..4, 0u8..4, 0u8..4).prop_map(|(p, c, d)| vec![2, p, c, d]),
        any::<[u8; 4]>().prop_map(|a| [&[0u8][..], &a].concat()),
        (0u8..3, any::<u16>(), any::<u8>()).prop_map(|(t, m, l)| {
            let m = m.to_le_bytes();
            vec![3, t, m[0], m[1], l]
        }),
        (0u8..4, 0u8..4).prop_map(|(p, d)| vec![5, p, d]),
    ]
}

/// A forwarded-header entry in one of the shapes seen in the wild (and some that are not).
fn entry() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u8..4, 0u8..4).prop_map(|(c, d)| format!("10.0.{c}.{d}")),
        any::<[u8; 4]>().prop_map(|a| std::net::Ipv4Addr::from(a).to_string()),
        (any::<[u8; 4]>(), any::<u16>())
            .prop_map(|(a, p)| format!("{}:{p}", std::net::Ipv4Addr::from(a))),
        any::<[u16; 8]>().prop_map(|a| format!("[{}]:443", std::net::Ipv6Addr::from(a))),
        any::<[u8; 4]>().prop_map(|a| format!("::ffff:{}", std::net::Ipv4Addr::from(a))),
        Just("unknown".to_string()),
        Just("_hidden".to_string()),
        Just(String::new()),
        Just("fe80::1%eth0".to_string()),
        "[ -~]{0,12}",
    ]
}

fn forwarded_input() -> impl Strategy<Value = Vec<u8>> {
    (
        0u8..3,
        ip_bytes(),
        proptest::collection::vec((ip_bytes(), any::<u8>()), 0..4),
        prop_oneof![Just(56u8), any::<u8>()],
        proptest::collection::vec(entry(), 0..4),
        proptest::collection::vec(proptest::collection::vec(entry(), 0..6), 0..4),
        any::<bool>(),
    )
        .prop_map(|(kind, peer, cidrs, v6, attacker, lines, fwd)| {
            let wrap = |e: &String| {
                if fwd && kind == 1 {
                    format!("for=\"{e}\";proto=https")
                } else {
                    e.clone()
                }
            };
            let mut out = vec![kind];
            out.extend(peer);
            out.push(u8::try_from(cidrs.len()).expect("few ranges"));
            for (ip, prefix) in cidrs {
                out.extend(ip);
                out.push(prefix);
            }
            out.push(v6);
            let attacker = attacker.iter().map(wrap).collect::<Vec<_>>().join(", ");
            let attacker = &attacker.as_bytes()[..attacker.len().min(80)];
            out.push(u8::try_from(attacker.len()).expect("short"));
            out.extend_from_slice(attacker);
            let lines: Vec<String> = lines
                .iter()
                .map(|l| l.iter().map(wrap).collect::<Vec<_>>().join(", "))
                .collect();
            out.extend_from_slice(lines.join("\n").as_bytes());
            out
        })
}

fn quota_text() -> impl Strategy<Value = Vec<u8>> {
    let one = "[0-9]{1,11} ?(/|per |PER ) ?[0-9]{0,13} ?(s|ms|us|µs|ns|m|h|d|sec|minute|hours|day|days|fortnight)";
    (
        proptest::collection::vec(one, 1..4),
        prop_oneof![Just("; "), Just(","), Just(";")],
    )
        .prop_map(|(qs, sep)| [&[0u8][..], qs.join(sep).as_bytes()].concat())
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..400)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn forwarded_structured(data in forwarded_input()) {
        fuzzing::forwarded(&data);
    }

    #[test]
    fn forwarded_bytes(data in bytes()) {
        fuzzing::forwarded(&data);
    }

    #[test]
    fn quota_text_and_round_trips(data in prop_oneof![quota_text(), bytes()]) {
        fuzzing::quota(&data);
    }

    #[test]
    fn ip_mask(data in bytes()) {
        fuzzing::ip_mask(&data);
    }

    #[test]
    fn strategy_traces(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        fuzzing::strategy(&data);
    }

    #[test]
    fn redis_reply(data in bytes()) {
        fuzzing::redis_reply(&data);
    }

    #[test]
    fn key_encoding(data in bytes()) {
        fuzzing::key_encoding(&data);
    }
}
