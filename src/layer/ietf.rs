//! Pieces of the IETF fields (draft-ietf-httpapi-ratelimit-headers-11) that need more than
//! formatting: the partition key `pk` (a keyed hash of the key, never the key itself), the
//! jitter on `t`, and item names kept unique when stacked limiters share a name.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::store::StoreKey;

/// How many bytes of the HMAC a partition key keeps: 96 bits, 16 base64 characters.
const PK_BYTES: usize = 12;

/// The secret the partition keys are computed with.
#[derive(Clone)]
pub(crate) struct PkSecret(Arc<[u8]>);

impl std::fmt::Debug for PkSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PkSecret(<redacted>)")
    }
}

impl PkSecret {
    pub(crate) fn new(secret: &[u8]) -> Self {
        Self(Arc::from(secret))
    }

    /// A secret drawn once per process: partition keys then differ between instances, which the
    /// caller warns about.
    pub(crate) fn random() -> Self {
        use std::hash::BuildHasher;
        static RANDOM: std::sync::OnceLock<PkSecret> = std::sync::OnceLock::new();
        RANDOM
            .get_or_init(|| {
                let mut bytes = Vec::with_capacity(32);
                for i in 0u64..4 {
                    let h = std::hash::RandomState::new().hash_one((i, std::process::id()));
                    bytes.extend_from_slice(&h.to_le_bytes());
                }
                PkSecret(Arc::from(bytes))
            })
            .clone()
    }

    /// The `pk` value of `key`: `:BASE64:` of the first bytes of HMAC-SHA256(secret, encoding).
    pub(crate) fn partition_key<K: StoreKey>(&self, key: &K) -> String {
        let mut bytes = Vec::new();
        key.encode(&mut bytes);
        let mac = hmac_sha256(&self.0, &bytes);
        format!(":{}:", base64(mac.get(..PK_BYTES).unwrap_or(&mac)))
    }
}

/// HMAC-SHA256 (RFC 2104).
pub(crate) fn hmac_sha256(secret: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut key = [0u8; BLOCK];
    let hashed;
    let secret = if secret.len() > BLOCK {
        hashed = Sha256::digest(secret);
        hashed.as_slice()
    } else {
        secret
    };
    for (k, s) in key.iter_mut().zip(secret) {
        *k = *s;
    }
    let pad = |byte: u8| key.map(|k| k ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// Standard base64 with padding (RFC 4648), the alphabet of a structured field's byte sequence.
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [0, 1, 2].map(|i| chunk.get(i).copied().unwrap_or(0));
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                let digit = ALPHABET.get(((n >> (18 - 6 * i)) & 63) as usize);
                out.push(char::from(digit.copied().unwrap_or(b'A')));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A random number of whole seconds in `0..=max` (not for cryptography: it spreads clients).
pub(crate) fn jitter(max: u64) -> u64 {
    use std::cell::Cell;
    use std::hash::BuildHasher;
    if max == 0 {
        return 0;
    }
    thread_local! {
        static STATE: Cell<u64> = Cell::new(std::hash::RandomState::new().hash_one(0u8) | 1);
    }
    let x = STATE.with(|s| {
        // xorshift64
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    });
    x % (max + 1)
}

/// The item names (as written: escaped, without the quotes) of a `RateLimit-Policy` or
/// `RateLimit` list: the sf-string that starts each member. Parameters are skipped, quoted
/// strings among them too (a `qu` may hold a comma).
pub(crate) fn item_names(list: &[u8]) -> Vec<&[u8]> {
    let mut names = Vec::new();
    let mut at_item = true;
    let mut i = 0;
    while let Some(&c) = list.get(i) {
        match c {
            b'"' => {
                let start = i + 1;
                i = start;
                while let Some(&c) = list.get(i) {
                    match c {
                        b'\\' => i += 2,
                        b'"' => break,
                        _ => i += 1,
                    }
                }
                if at_item {
                    names.push(list.get(start..i).unwrap_or_default());
                    at_item = false;
                }
            }
            b',' => at_item = true,
            _ => {}
        }
        i += 1;
    }
    names
}

/// The policy name under which a limiter named `name`, whose item names `items(name)` gives,
/// adds its items to fields that already hold `taken`: `name` itself when none of its items is
/// taken, else `NAME-2`, `NAME-3`, ... the first whose items are all free. Deterministic: the
/// same stack gives the same names on every response.
pub(crate) fn unique_name(
    name: &str,
    taken: &[&[u8]],
    items: impl Fn(&str) -> Vec<String>,
) -> Option<String> {
    let free = |candidate: &str| {
        items(candidate)
            .iter()
            .all(|item| !taken.contains(&item.as_bytes()))
    };
    if free(name) {
        return None;
    }
    // Each taken item blocks at most one suffix: one of these is free.
    (2..=taken.len() + 2)
        .map(|k| format!("{name}-{k}"))
        .find(|candidate| free(candidate))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test cases 1, 2 and 6 (a key longer than the block).
        assert_eq!(
            hex(&hmac_sha256(&[0x0b; 20], b"Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn base64_matches_rfc_4648() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), coded);
        }
    }

    #[test]
    fn partition_keys_depend_on_key_and_secret_and_never_show_the_key() {
        let a = PkSecret::new(b"one secret");
        let b = PkSecret::new(b"another secret");
        let key = "sk_live_0123456789".to_string();
        let pk = a.partition_key(&key);
        assert_eq!(pk.len(), 2 + 16, "{pk}");
        assert!(pk.starts_with(':') && pk.ends_with(':'));
        assert_eq!(pk, a.partition_key(&key), "stable");
        assert_eq!(
            pk,
            PkSecret::new(b"one secret").partition_key(&key),
            "same secret, same pk"
        );
        assert_ne!(pk, b.partition_key(&key));
        assert_ne!(pk, a.partition_key(&"sk_live_0123456780".to_string()));
        assert!(!pk.contains("sk_live"));
        assert_eq!(
            PkSecret::random().partition_key(&key),
            PkSecret::random().partition_key(&key),
            "one random secret per process"
        );
    }

    #[test]
    fn jitter_stays_in_range_and_varies() {
        assert_eq!(jitter(0), 0);
        let draws: Vec<u64> = (0..200).map(|_| jitter(3)).collect();
        assert!(draws.iter().all(|&j| j <= 3));
        for v in 0..=3 {
            assert!(draws.contains(&v), "{v} never drawn in 200 draws");
        }
    }
}
