//! Header values of numbers without an allocation per response: a table of the small numbers,
//! the rule's own limits rendered once, and a short memory of recent larger values.

use std::sync::Arc;

use http::HeaderValue;

use crate::rule::Rule;

/// Header values rendered once for the numbers that repeat on every response of a rule: each
/// quota's limit (and burst), which `x-ratelimit-limit` carries, when too large for the table of
/// small numbers. A clone is a reference count, not an allocation.
#[derive(Clone, Debug, Default)]
pub(crate) struct Numbers {
    values: Arc<[(u64, HeaderValue)]>,
}

impl Numbers {
    pub(crate) fn for_rule(rule: &Rule) -> Self {
        small_numbers();
        let mut values: Vec<(u64, HeaderValue)> = Vec::new();
        for q in rule.quotas() {
            for n in [q.limit(), q.burst()].map(u64::from) {
                if n >= SMALL_NUMBERS as u64 && values.iter().all(|(m, _)| *m != n) {
                    values.push((n, shared_num(n)));
                }
            }
        }
        Self {
            values: values.into(),
        }
    }

    /// The header value of `n`: from the table, from this cache, or rendered now.
    pub(crate) fn get(&self, n: u64) -> HeaderValue {
        if n >= SMALL_NUMBERS as u64 {
            if let Some((_, v)) = self.values.iter().find(|(m, _)| *m == n) {
                return v.clone();
            }
        }
        num(n)
    }
}

/// `n` rendered into shared bytes, so that clones only count references.
fn shared_num(n: u64) -> HeaderValue {
    let value = render(n);
    // The first clone moves the bytes to shared storage: done here, not on a request.
    drop(value.clone());
    value
}

/// Numbers below this are written from a table built once: no allocation per response for them.
const SMALL_NUMBERS: usize = 4096;

pub(crate) fn num(n: u64) -> HeaderValue {
    if let Some(s) = usize::try_from(n).ok().and_then(|i| small_numbers().get(i)) {
        return HeaderValue::from_static(s);
    }
    RECENT
        .try_with(|r| r.borrow_mut().get(n))
        .unwrap_or_else(|_| render(n))
}

/// The table of the numbers below [`SMALL_NUMBERS`]: one string of them all and a slice of each,
/// kept for the life of the process (~79 KiB). Built in two allocations of their final size
/// (no buffer grown and freed on the way), when the first layer is built rather than on a
/// request: the table leaves no freed blocks behind in a serving thread's heap.
fn small_numbers() -> &'static [&'static str] {
    static SMALL: std::sync::OnceLock<Box<[&'static str]>> = std::sync::OnceLock::new();
    SMALL.get_or_init(|| {
        let digits = |i: usize| i.checked_ilog10().map_or(1, |d| d as usize + 1);
        let mut all = String::with_capacity((0..SMALL_NUMBERS).map(digits).sum());
        for i in 0..SMALL_NUMBERS {
            all.push_str(itoa::Buffer::new().format(i));
        }
        let all: &'static str = Box::leak(all.into_boxed_str());
        let mut start = 0;
        (0..SMALL_NUMBERS)
            .map(|i| {
                let end = start + digits(i);
                let s = all.get(start..end).unwrap_or("0");
                start = end;
                s
            })
            .collect()
    })
}

fn render(n: u64) -> HeaderValue {
    HeaderValue::from_str(itoa::Buffer::new().format(n)).unwrap_or(HeaderValue::from_static("0"))
}

thread_local! {
    static RECENT: std::cell::RefCell<Recent> = std::cell::RefCell::new(Recent {
        slots: [const { (0, 0, None) }; Recent::SLOTS],
        arena: bytes::BytesMut::new(),
    });
}

/// Large numbers seen lately on this thread and their header values, like hyper's cached `Date`:
/// under a flood, `Retry-After` and `x-ratelimit-reset` repeat for a second; a bucket's
/// `remaining` repeats while a key stays under its rate. Keeping a value costs an allocation, so a
/// number is kept only once it came [`Recent::KEEP_AFTER`] times in a row to its slot: numbers
/// that change on every response (a window's `remaining`) cost a comparison more, not a copy.
pub(crate) struct Recent {
    /// Per slot: the number last seen, how many times in a row, and its value once kept.
    slots: [(u64, u8, Option<HeaderValue>); Recent::SLOTS],
    /// Where numbers that are not kept are rendered (a window's `remaining`, a new `reset`).
    arena: bytes::BytesMut,
}

impl Recent {
    const SLOTS: usize = 8;
    const KEEP_AFTER: u8 = 4;
    /// The size of an arena buffer: a few dozen numbers.
    const ARENA: usize = 512;

    pub(crate) fn get(&mut self, n: u64) -> HeaderValue {
        // Fibonacci hashing: the top 3 bits of the product pick one of the 8 slots.
        let i = usize::try_from(n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 61).unwrap_or(0);
        let Some(slot) = self.slots.get_mut(i) else {
            return self.render(n);
        };
        if slot.0 != n {
            *slot = (n, 1, None);
            return self.render(n);
        }
        if let Some(v) = &slot.2 {
            return v.clone();
        }
        slot.1 += 1;
        if slot.1 >= Self::KEEP_AFTER {
            // Its own allocation, not a piece of the arena (which it would keep alive); the clone
            // moves the bytes to shared storage, and later clones only count references.
            let v = render(n);
            slot.2 = Some(v.clone());
            return v;
        }
        self.render(n)
    }

    /// `n` rendered into the arena: a piece of a shared buffer (a reference count, no allocation
    /// of its own). When the buffer is full, `reserve` takes it back if every piece was dropped
    /// (the responses that carried them were sent), else starts another.
    fn render(&mut self, n: u64) -> HeaderValue {
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(n).as_bytes();
        if self.arena.capacity() < digits.len() {
            self.arena.reserve(Self::ARENA);
        }
        self.arena.extend_from_slice(digits);
        HeaderValue::from_maybe_shared(self.arena.split().freeze())
            .unwrap_or_else(|_| HeaderValue::from_static("0"))
    }
}

#[cfg(test)]
impl Numbers {
    /// How many values are rendered ahead.
    pub(crate) fn cached(&self) -> usize {
        self.values.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_numbers_are_kept_after_repeats_and_replaced_exactly() {
        for n in [86_400u64, 999_999_999, 4096] {
            for i in 0..10 {
                assert_eq!(num(n), n.to_string().as_str(), "{n}, use {i}");
            }
        }
        // A number that changes on every call, through every slot.
        for n in 1_000_000..1_000_100u64 {
            assert_eq!(num(n), n.to_string().as_str());
        }
        assert_eq!(num(86_400), "86400", "after its slot was taken");
        let kept = RECENT.with_borrow(|r| r.slots.iter().filter(|s| s.2.is_some()).count());
        assert!(kept <= Recent::SLOTS);
    }

    #[test]
    fn arena_values_stay_exact_across_buffers() {
        // Held values outlive their buffer's turn; dropped ones let it be taken back.
        let held: Vec<(u64, HeaderValue)> = (0..500u64)
            .map(|i| 7_000_000 + i * 13)
            .map(|n| (n, num(n)))
            .collect();
        for (n, v) in &held {
            assert_eq!(v, n.to_string().as_str());
        }
        drop(held);
        for n in (0..500u64).map(|i| u64::MAX - i) {
            assert_eq!(num(n), n.to_string().as_str());
        }
    }
}
