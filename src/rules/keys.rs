//! Reading a request's key for a limit, into a buffer the previous request on the thread gave
//! back (a key costs no allocation of its own).

use std::cell::Cell;

use http::request::Parts;

use super::file::{KeyPart, KeySpec};
use super::reload::content_hash;
use super::{IpSource, Limit, RulesOptions};
use crate::Clock;
use crate::key::{KeyError, KeyExtractor};
use crate::store::{Store, StoreKey};

impl<St: Store<Vec<u8>>, C: Clock> Limit<St, C> {
    /// The request's key under this limit, or the global one when the limit counts requests
    /// without a key there.
    pub(super) fn key_or_global(
        &self,
        parts: &Parts,
        options: &RulesOptions,
    ) -> Result<Vec<u8>, KeyError> {
        match self.key(parts, options) {
            Err(_) if self.missing_global => Ok(self.global_key()),
            other => other,
        }
    }

    /// The key of a request without one, when the limit counts those in one global bucket.
    pub(super) fn global_key(&self) -> Vec<u8> {
        let mut out = key_buffer();
        out.extend_from_slice(&self.key_tag);
        out.push(b'G');
        out
    }

    /// The request's key under this limit: the key spec's tag, then each part.
    pub(super) fn key(&self, parts: &Parts, options: &RulesOptions) -> Result<Vec<u8>, KeyError> {
        let mut out = key_buffer();
        out.extend_from_slice(&self.key_tag);
        for part in self.spec.key.parts() {
            match part {
                KeyPart::Ip => {
                    out.push(b'i');
                    match &options.ip {
                        IpSource::Peer(p) => p.extract(parts)?.encode(&mut out),
                        IpSource::Forwarded(f) => f.extract(parts)?.encode(&mut out),
                    }
                }
                KeyPart::Global => out.push(b'g'),
                KeyPart::Named(name) => {
                    let v = options.keys.extract(name, parts)?;
                    out.push(b'n');
                    let len = u32::try_from(v.len()).unwrap_or(u32::MAX);
                    out.extend_from_slice(&len.to_be_bytes());
                    out.extend_from_slice(&v);
                }
                KeyPart::Header(name) => {
                    let v = crate::key::header_value_key(&parts.headers, name)?;
                    out.push(b'h');
                    let at = out.len();
                    out.extend_from_slice(&[0; 4]);
                    v.encode(&mut out);
                    let len = u32::try_from(out.len() - at - 4).unwrap_or(u32::MAX);
                    if let Some(slot) = out.get_mut(at..at + 4) {
                        slot.copy_from_slice(&len.to_be_bytes());
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The 4 bytes every key of a limit with this key spec starts with.
pub(super) fn key_tag(spec: &KeySpec) -> [u8; 4] {
    let digest = content_hash(spec.to_string().as_bytes());
    [digest[0], digest[1], digest[2], digest[3]]
}

/// Room for most keys (a tag, an IP address, a short name or header value).
const KEY_ROOM: usize = 40;

/// The largest buffer kept for the next key: a rare long key (a long header value) is freed.
const SPARE_MAX: usize = 256;

thread_local! {
    /// The buffer of a key a request on this thread was done with, for the next one's key.
    static SPARE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// An empty buffer for a key, with room for most: the thread's spare one, or a new one.
fn key_buffer() -> Vec<u8> {
    let mut out = SPARE.try_with(Cell::take).unwrap_or_default();
    out.reserve(KEY_ROOM);
    out
}

/// Keeps `key`'s buffer for the next key read on this thread (one at most: a previous one is
/// freed).
pub(super) fn give_back(mut key: Vec<u8>) {
    if key.capacity() == 0 || key.capacity() > SPARE_MAX {
        return;
    }
    key.clear();
    // Past the thread's end (no spare any more) the buffer is freed.
    let _ = SPARE.try_with(|spare| spare.set(key));
}
