//! A stable byte encoding of keys, so that network stores (Redis) can name them.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// A key a store can hold: hashable for memory, with a stable, injective byte encoding for network
/// stores (two different keys never encode alike).
pub trait StoreKey: std::hash::Hash + Eq + Clone + Send + Sync + 'static {
    /// Appends the key's encoding to `out`. Must be injective and stable across versions.
    fn encode(&self, out: &mut Vec<u8>);
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
}

impl StoreKey for Ipv6Addr {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.octets());
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
}

/// Encodes `key` with a 4-byte big-endian length prefix, so that a sequence of parts is injective.
pub(crate) fn encode_part<K: StoreKey>(key: &K, out: &mut Vec<u8>) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    key.encode(out);
    let len = u32::try_from(out.len() - at - 4).unwrap_or(u32::MAX);
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

macro_rules! tuple_keys {
    ($($name:ident),+) => {
        impl<$($name: StoreKey),+> StoreKey for ($($name,)+) {
            #[allow(non_snake_case)]
            fn encode(&self, out: &mut Vec<u8>) {
                let ($($name,)+) = self;
                $(encode_part($name, out);)+
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
    fn ip_versions_never_collide() {
        let v4: IpAddr = "1.2.3.4".parse().unwrap();
        let v6: IpAddr = "::102:304".parse().unwrap();
        assert_ne!(enc(&v4), enc(&v6));
    }
}
