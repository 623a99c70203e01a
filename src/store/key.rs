//! A stable byte encoding of keys, so that network stores (Redis) can name them.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// A key a store can hold: hashable for memory, with a stable, injective byte encoding for network
/// stores (two different keys never encode alike).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a rate-limit key: it does not implement `StoreKey`",
    label = "this key type needs `tollgate::store::StoreKey`",
    note = "implement `StoreKey` for `{Self}` (a stable, injective byte encoding), or key by a type \
            that has it (`String`, integers, `IpAddr`, tuples of keys)"
)]
pub trait StoreKey: std::hash::Hash + Eq + Clone + Send + Sync + 'static {
    /// Appends the key's encoding to `out`. Must be injective and stable across versions.
    fn encode(&self, out: &mut Vec<u8>);

    /// How the key appears in logs ([`KeyPolicy::log_keys`](crate::layer::KeyPolicy::log_keys)):
    /// by default a short hash of its encoding, keyed per process (`#` and 12 hex digits), so that
    /// one key's events can be followed without the logs holding secrets (API keys, user ids).
    /// IP addresses show as text.
    fn log_text(&self) -> String {
        let mut bytes = Vec::new();
        self.encode(&mut bytes);
        keyed_hash(&bytes)
    }
}

/// `#` and 12 hex digits of a hash of `bytes` keyed by a per-process random seed.
pub(crate) fn keyed_hash(bytes: &[u8]) -> String {
    use std::hash::BuildHasher;
    static SEED: std::sync::OnceLock<foldhash::quality::RandomState> = std::sync::OnceLock::new();
    let hash = SEED.get_or_init(Default::default).hash_one(bytes);
    format!("#{:012x}", hash >> 16)
}

macro_rules! int_keys {
    ($($t:ty),*) => {$(
        impl StoreKey for $t {
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_be_bytes());
            }
        }
    )*};
}
int_keys!(u8, u16, u32, u64, u128, i32, i64);

impl StoreKey for () {
    fn encode(&self, _out: &mut Vec<u8>) {}
}

impl StoreKey for String {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl StoreKey for &'static str {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl StoreKey for Cow<'static, str> {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl StoreKey for Vec<u8> {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl StoreKey for Arc<str> {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl StoreKey for Ipv4Addr {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.octets());
    }

    fn log_text(&self) -> String {
        self.to_string()
    }
}

impl StoreKey for Ipv6Addr {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.octets());
    }

    fn log_text(&self) -> String {
        self.to_string()
    }
}

impl StoreKey for IpAddr {
    /// 4 bytes for IPv4 and 16 for IPv6: the length tells them apart.
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            IpAddr::V4(a) => a.encode(out),
            IpAddr::V6(a) => a.encode(out),
        }
    }

    fn log_text(&self) -> String {
        self.to_string()
    }
}

/// Encodes `key` with a 4-byte big-endian length prefix, so that a sequence of parts is injective.
pub(crate) fn encode_part<K: StoreKey>(key: &K, out: &mut Vec<u8>) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    key.encode(out);
    let len = u32::try_from(out.len() - at - 4).unwrap_or(u32::MAX);
    if let Some(prefix) = out.get_mut(at..at + 4) {
        prefix.copy_from_slice(&len.to_be_bytes());
    }
}

macro_rules! tuple_keys {
    ($($name:ident),+) => {
        impl<$($name: StoreKey),+> StoreKey for ($($name,)+) {
            #[allow(non_snake_case)]
            fn encode(&self, out: &mut Vec<u8>) {
                let ($($name,)+) = self;
                $(encode_part($name, out);)+
            }

            /// Each part as it shows in logs, in parentheses.
            #[allow(non_snake_case)]
            fn log_text(&self) -> String {
                let ($($name,)+) = self;
                let parts: Vec<String> = vec![$($name.log_text()),+];
                format!("({})", parts.join(", "))
            }
        }
    };
}
tuple_keys!(A, B);
tuple_keys!(A, B, C);
tuple_keys!(A, B, C, D);

#[cfg(test)]
mod tests {
    use super::*;

    fn enc<K: StoreKey>(k: &K) -> Vec<u8> {
        let mut v = Vec::new();
        k.encode(&mut v);
        v
    }

    #[test]
    fn tuples_are_injective_across_separators() {
        let a = ("a:b".to_string(), "r".to_string());
        let b = ("a".to_string(), "b:r".to_string());
        assert_ne!(enc(&a), enc(&b));
        let c = (String::new(), "ab".to_string());
        let d = ("ab".to_string(), String::new());
        assert_ne!(enc(&c), enc(&d));
    }

    #[test]
    fn logs_show_ips_as_text_and_other_keys_as_a_keyed_hash() {
        let ip: IpAddr = "203.0.113.9".parse().unwrap();
        assert_eq!(ip.log_text(), "203.0.113.9");
        let secret = "sk_live_0123456789".to_string();
        let shown = secret.log_text();
        assert!(!shown.contains("sk_live"), "{shown}");
        assert_eq!(shown.len(), 13);
        assert_eq!(shown, secret.log_text(), "stable within a process");
        assert_ne!(shown, "sk_live_0123456780".to_string().log_text());
        let pair = (ip, secret);
        assert!(
            pair.log_text().starts_with("(203.0.113.9, #"),
            "{}",
            pair.log_text()
        );
    }

    #[test]
    fn ip_versions_never_collide() {
        let v4: IpAddr = "1.2.3.4".parse().unwrap();
        let v6: IpAddr = "::102:304".parse().unwrap();
        assert_ne!(enc(&v4), enc(&v6));
    }
}
