//! Redis key names: `<prefix>{<tag>}:<name>:<suffix>`, one hash tag per logical key, and `<name>`
//! the hex of the limiter name's hash: a key's state is identified by (limiter name, key), never by
//! the rule it is counted under (the state records that).
//!
//! The tag is the hex of the key's length-prefixed encoding ([`encode_part`]), or `#` and the hex of
//! its SHA-256 when that encoding is longer than [`MAX_RAW`] bytes: injective for short keys (hex is),
//! collision-resistant for long ones, and never containing a brace, so every Redis key of one
//! logical key hashes to the same Cluster slot whatever bytes the user key holds.

use sha2::{Digest, Sha256};

use crate::store::StoreKey;
use crate::store::key::encode_part;

/// Encodings longer than this are hashed, which bounds the length of every Redis key.
pub(super) const MAX_RAW: usize = 48;
/// The longest prefix accepted.
pub(super) const MAX_PREFIX: usize = 64;

const HEX: &[u8; 16] = b"0123456789abcdef";

fn push_hex(out: &mut String, bytes: &[u8]) {
    let digit = |n: u8| char::from(HEX.get(usize::from(n)).copied().unwrap_or(b'0'));
    for b in bytes {
        out.push(digit(b >> 4));
        out.push(digit(b & 0xf));
    }
}

/// `<prefix>{<tag>}:`, to which the name's part and the strategy's suffix are appended.
pub(super) fn tagged_key<K: StoreKey>(prefix: &str, key: &K) -> String {
    let mut raw = Vec::with_capacity(24);
    encode_part(key, &mut raw);
    let mut s = String::with_capacity(prefix.len() + 2 * MAX_RAW + 8);
    s.push_str(prefix);
    s.push('{');
    if raw.len() <= MAX_RAW {
        push_hex(&mut s, &raw);
    } else {
        s.push('#');
        push_hex(&mut s, &Sha256::digest(&raw));
    }
    s.push_str("}:");
    s
}

/// `<prefix>{<tag>}:<name>:`: the base of every Redis key holding `key`'s state under the limiter
/// whose name hashes to `name` ([`name_hash`](crate::store::name_hash)).
pub(super) fn base_key<K: StoreKey>(prefix: &str, key: &K, name: u64) -> String {
    let mut s = tagged_key(prefix, key);
    s.push_str(&format!("{name:016x}:"));
    s
}

/// The part of a Redis key that picks its Cluster slot (up to the hash tag's end).
pub(super) fn slot_part(name: &str) -> &str {
    name.find('}').and_then(|i| name.get(..=i)).unwrap_or(name)
}

/// Why a prefix is refused, if it is.
pub(super) fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.len() > MAX_PREFIX {
        return Err(format!(
            "key prefix is {} bytes long (at most {MAX_PREFIX})",
            prefix.len()
        ));
    }
    if prefix.contains(['{', '}']) {
        return Err(format!(
            "key prefix {prefix:?} contains a brace, which would change the Cluster hash tag"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_are_hex_and_long_keys_hashed() {
        assert_eq!(tagged_key("rl:", &"ab".to_string()), "rl:{000000026162}:");
        let long = "x".repeat(1000);
        let k = tagged_key("rl:", &long);
        assert!(k.starts_with("rl:{#") && k.len() == 3 + 2 + 64 + 2, "{k}");
        assert_ne!(k, tagged_key("rl:", &"x".repeat(1001)));
        assert_eq!(
            base_key("rl:", &"ab".to_string(), 0xab),
            "rl:{000000026162}:00000000000000ab:"
        );
        assert_eq!(slot_part("rl:{0a}:1:h"), "rl:{0a}");
    }

    #[test]
    fn braces_in_keys_stay_out_of_the_tag() {
        let k = base_key("p:", &"}{a}".to_string(), 1);
        assert_eq!(k.matches('{').count(), 1);
        assert_eq!(k.matches('}').count(), 1);
        assert!(check_prefix("a{b").is_err());
        assert!(check_prefix(&"p".repeat(65)).is_err());
        assert!(check_prefix("tollgate:").is_ok());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 512, failure_persistence: None, ..Default::default() })]
        #[test]
        fn distinct_keys_get_distinct_names(
            a in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80),
            b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80),
            split in 0usize..80,
        ) {
            // Moving bytes from one part to the other (separator injection) changes the name.
            let k = split.min(b.len());
            let mut a2 = a.clone();
            a2.extend_from_slice(&b[..k]);
            let y = (a2, b[k..].to_vec());
            let x = (a, b);
            let (kx, ky) = (tagged_key("p:", &x), tagged_key("p:", &y));
            proptest::prop_assert_eq!(kx == ky, x == y);
            proptest::prop_assert!(kx.len() <= 2 + 2 + 2 * MAX_RAW + 2);
            proptest::prop_assert_eq!(kx.matches('{').count(), 1);
            proptest::prop_assert_eq!(kx.matches('}').count(), 1);
        }
    }
}
