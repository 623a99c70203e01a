//! Where the fields of a packed word are: a window's index and counts, a first-hit window's start
//! on a ring of grains, a bucket's TAT.

use super::{MIN_RING_BITS, RING_SPAN};
use crate::strategy::{FixedWindow, Params, Verdict, first_hit_layout};

/// Where the fields of a packed word are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// `index << count_bits | count`.
    Fixed { count_bits: u32, ring: Ring },
    /// `index << (count_bits + prev_bits) | cur << prev_bits | ceil(prev / 2^prev_shift)`, with
    /// `prev_bits = count_bits - prev_shift`.
    Sliding {
        count_bits: u32,
        prev_shift: u32,
        ring: Ring,
    },
    /// A first-hit window (see [`Hit`]).
    FirstHit(Hit),
    /// The TAT.
    Gcra,
}

/// The layout of a first-hit window: `(ceil(start / g) mod 2^ring.bits) << count_bits | count`,
/// the start in units of `g = 2^grain_bits` ns (rounded up) on a ring spanning at least
/// [`RING_SPAN`](super::RING_SPAN) and two windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Hit {
    pub(super) count_bits: u32,
    /// `log2(g)`: 0 (the start whole, exact) when the ring of nanoseconds fits.
    pub(super) grain_bits: u32,
    pub(super) ring: Ring,
}

impl Hit {
    /// The count and grain bits for `p`: the ring holds what is left of 63 bits after the count,
    /// in units of the smallest power of two that makes it span [`RING_SPAN`] and two windows.
    pub(super) fn layout(p: &Params) -> (u32, u32) {
        first_hit_layout(p)
    }

    /// The layout for `p` (every limit up to `u32::MAX`, every window).
    pub(super) fn new(p: &Params) -> Option<Self> {
        let (count_bits, grain_bits) = Self::layout(p);
        // A ring of at least MIN_RING_BITS units of at most 2^40 ns (18 minutes).
        let ring_bits = 63u32.checked_sub(count_bits)?;
        (ring_bits >= MIN_RING_BITS && grain_bits <= 40).then_some(Self {
            count_bits,
            grain_bits,
            ring: Ring::new(ring_bits),
        })
    }

    /// `start` rounded up to the grain: the start as stored and read back.
    #[inline(always)]
    pub(super) fn round_up(self, start: u64) -> u64 {
        let g = (1u64 << self.grain_bits) - 1;
        start.saturating_add(g) & !g
    }

    /// The window in `word` (without the second-chance bit), read at `now`.
    #[inline(always)]
    pub(super) fn unpack(self, word: u64, now: u64) -> FixedWindow {
        let count = word & ((1 << self.count_bits) - 1);
        if count == 0 {
            return FixedWindow::default();
        }
        let unit = self
            .ring
            .index(word >> self.count_bits, now >> self.grain_bits);
        FixedWindow::from_parts(unit.saturating_mul(1 << self.grain_bits), count)
    }

    /// `s` as a word, its start rounded up to the grain (a count that would not fit saturates).
    /// No count, no window: 0.
    #[inline(always)]
    pub(super) fn pack(self, s: &FixedWindow) -> u64 {
        let (start, count) = s.parts();
        if count == 0 {
            return 0;
        }
        let unit = start.saturating_add((1 << self.grain_bits) - 1) >> self.grain_bits;
        ((unit & self.ring.mask) << self.count_bits) | count.min((1 << self.count_bits) - 1)
    }

    /// `v`, answered on the state `s` after the operation at `now`, with its times pointing at the
    /// rounded window's end: the strategy measures them from `max(now, start)`, and a rounded start
    /// may be up to `g - 1` ns after `now` (the window opened at `now`). A start further ahead is
    /// a clock that went back: measured from `start - (g - 1)` at the latest, as the strategy
    /// clamps such a clock to the state's time (a wait stays within the horizon `W + g - 1`).
    /// Exact layouts: `v`.
    #[inline(always)]
    pub(super) fn honest(self, mut v: Verdict, s: &FixedWindow, now: u64) -> Verdict {
        if self.grain_bits == 0 {
            return v;
        }
        let (start, count) = s.parts();
        if count == 0 {
            return v;
        }
        let late = self
            .round_up(start)
            .saturating_sub(now)
            .min((1 << self.grain_bits) - 1);
        if v.reset_after > 0 {
            v.reset_after = v.reset_after.saturating_add(late);
        }
        if v.retry_after > 0 {
            v.retry_after = v.retry_after.saturating_add(late);
        }
        v
    }
}

/// How a window index is stored: whole, or on a ring of `2^bits` windows read relative to now.
///
/// Windows whose absolute index and counts do not fit (large limits, short windows) store the index
/// on a ring: modulo `2^k` with `2^k` windows spanning at least [`RING_SPAN`] (two days), read back
/// relative to the current window: up to 7/8 of the ring behind it, up to 1/8 ahead (a clock that
/// went back: a clock stepped back further than 1/8 of the ring, 6 hours at least, reads a state as
/// old and forgets its counts; the crate's clocks never go back, a custom [`Clock`](crate::Clock)
/// may). A state with zero counts reads as a new key's whatever its index. A state older than 7/8
/// of the ring would read as one ahead of now; the store does not keep one: while decisions come,
/// the sweep drops states once fresh (a whole rotation takes seconds), and the first decision after
/// a gap of 3 hours or more sweeps every state read as of the gap's start (one that reads as of now
/// as starting within a minute of now is kept, as a state another thread may have just written:
/// after a gap of a whole ring, give or take that minute, its counts apply one window more). A sliding
/// window counter whose two counts still do not fit keeps the previous bucket's count rounded up to
/// a multiple of `2^s` (it only weighs on the estimate, which it can raise by less than `2^s`: again
/// stricter, never more lenient): for `u32::MAX` per second, `s = 19`, about 1.2 x 10^-4 of the
/// limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ring {
    /// 0: the whole index.
    pub(super) bits: u32,
    /// `2^bits - 1` (all ones for the whole index).
    pub(super) mask: u64,
    /// How many windows behind the current one a state may be read: 7/8 of the ring.
    pub(super) behind_max: u64,
}

impl Ring {
    pub(super) const WHOLE: Self = Self::new(0);

    /// A ring of `2^bits` windows (0: the whole index).
    pub(super) const fn new(bits: u32) -> Self {
        if bits == 0 {
            return Self {
                bits,
                mask: u64::MAX,
                behind_max: u64::MAX,
            };
        }
        let size = 1u64 << bits;
        Self {
            bits,
            mask: size - 1,
            behind_max: size - size / 8,
        }
    }

    /// The smallest ring of windows of `w` nanoseconds spanning [`RING_SPAN`].
    pub(super) fn for_window(w: u64) -> Self {
        let windows = RING_SPAN.div_ceil(w.max(1));
        Self::new((u64::BITS - (windows - 1).leading_zeros()).max(MIN_RING_BITS))
    }

    /// The index field of the window starting at `start`.
    #[inline(always)]
    pub(super) fn store(self, start: u64, w: u64) -> u64 {
        (start / w) & self.mask
    }

    /// The start of the window whose index field is `field`, read at `now`.
    #[inline(always)]
    pub(super) fn start(self, field: u64, w: u64, now: u64) -> u64 {
        if self.bits == 0 {
            return field * w;
        }
        self.index(field, now / w).saturating_mul(w)
    }

    /// The index whose field is `field` (on a ring), read when the current index is `current`.
    #[inline(always)]
    pub(super) fn index(self, field: u64, current: u64) -> u64 {
        let behind = current.wrapping_sub(field) & self.mask;
        if behind < self.behind_max {
            current.saturating_sub(behind)
        } else {
            // Saturating: a word handed over past the end of packed time is read at any `now`.
            current.saturating_add((self.mask - behind).saturating_add(1))
        }
    }

    /// How far ahead of `now` a state read back from this ring may start.
    pub(super) fn ahead(self, w: u64) -> u64 {
        if self.bits == 0 {
            u64::MAX
        } else {
            ((1u64 << self.bits) / 8 - 1).saturating_mul(w)
        }
    }
}
