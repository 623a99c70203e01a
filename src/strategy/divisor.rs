//! Division by a divisor fixed in advance (a rule's window or emission interval) without a hardware
//! division: a multiply-high by a precomputed reciprocal, or a shift for a power of two.
//!
//! A 64-bit `div` takes tens of cycles on x86-64 cores; the multiply-high below takes one
//! multiplication and a shift. The packed memory store's checks divide by the window length up to
//! four times per check (the ring index, the window start, the previous count's share, the stored
//! index), so it precomputes one per rule.
//!
//! Exactness (Granlund and Montgomery 1994, theorem 4.2): for `d >= 3` not a power of two,
//! `l = ceil(log2(d))` and `m = ceil(2^(62 + l) / d)`, `floor(m * n / 2^(62 + l)) = floor(n / d)`
//! for every `n < 2^62`, because `m * d - 2^(62 + l) < d <= 2^l`; and `m < 2^63 + 1` fits 64 bits.
//! So `n / d` is the high word of the 64 x 64-bit product `m * n`, shifted right by `l - 2`: one
//! multiplication and a shift. Every time the packed store reads is below 2^62
//! (the memory store's `NOW_LIMIT`); a larger dividend (a product) takes the hardware division.
//! Powers of two (1 included) shift.

/// `n / d` for a fixed `d >= 1`, exact for every `u64` `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Divisor {
    /// `ceil(2^(62 + l) / d)`, or 0 for a power of two.
    multiplier: u64,
    /// `l - 2`, or `log2(d)` for a power of two.
    shift: u32,
    /// `d`.
    divisor: u64,
}

/// Dividends below this take the multiply-high.
const FAST_BELOW: u64 = 1 << 62;

impl Divisor {
    /// The reciprocal of `d` (0 is taken as 1).
    pub(crate) const fn new(d: u64) -> Self {
        let d = if d == 0 { 1 } else { d };
        if d.is_power_of_two() {
            return Self {
                multiplier: 0,
                shift: d.trailing_zeros(),
                divisor: d,
            };
        }
        // d >= 3, so 2 <= l <= 64 and 62 + l <= 126.
        let l = u64::BITS - (d - 1).leading_zeros();
        let m = (1u128 << (62 + l)).div_ceil(d as u128);
        Self {
            multiplier: m as u64,
            shift: l - 2,
            divisor: d,
        }
    }

    /// `d`.
    #[inline(always)]
    pub(crate) const fn get(&self) -> u64 {
        self.divisor
    }

    /// `n / d`.
    #[inline(always)]
    pub(crate) const fn div(&self, n: u64) -> u64 {
        if self.multiplier == 0 {
            return n >> self.shift;
        }
        if n >= FAST_BELOW {
            return n / self.divisor;
        }
        (((self.multiplier as u128 * n as u128) >> 64) as u64) >> self.shift
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dividends around every multiple boundary that matters for `d`, and the ends of `u64`.
    fn dividends(d: u64) -> Vec<u64> {
        let mut out = vec![
            0,
            1,
            2,
            d - 1,
            d,
            d.saturating_add(1),
            u64::MAX,
            u64::MAX - 1,
        ];
        out.extend([
            1u64 << 62,
            (1 << 62) - 1,
            (1 << 62) + 1,
            1 << 63,
            (1 << 63) - 1,
        ]);
        // q * d - 1, q * d, q * d + 1 for q at the largest multiples and a few small ones.
        let top = u64::MAX / d;
        for q in [1, 2, 3, 1000, top / 2, top - 1, top] {
            if let Some(m) = q.checked_mul(d) {
                out.extend([
                    m.saturating_sub(1),
                    m,
                    m.saturating_add(1),
                    m.saturating_add(d - 1),
                ]);
            }
        }
        out
    }

    fn agree(d: u64, n: u64) {
        let r = Divisor::new(d);
        assert_eq!(r.div(n), n / d, "{n} / {d}");
    }

    #[test]
    fn the_reciprocal_divides_exactly_at_the_edges() {
        let mut divisors = vec![
            1,
            2,
            3,
            5,
            7,
            10,
            1_000_000,
            1_000_000_000,
            60_000_000_000,
            3_600_000_000_000,
            86_400_000_000_000,
            u64::MAX,
            u64::MAX - 1,
            u64::MAX / 2,
            u64::MAX / 3,
            (1 << 63) + 1,
        ];
        for k in 0..64 {
            let p = 1u64 << k;
            divisors.extend([p, p.saturating_sub(1).max(1), p.saturating_add(1)]);
        }
        // Divisors near 2^62 (NOW_LIMIT) and 2^32.
        for base in [1u64 << 62, 1 << 32, 1 << 31] {
            for delta in 0..8 {
                divisors.extend([base - delta - 1, base + delta]);
            }
        }
        for d in divisors {
            for n in dividends(d) {
                agree(d, n);
            }
        }
        assert_eq!(Divisor::new(0).div(17), 17);
        assert_eq!(Divisor::new(1).div(u64::MAX), u64::MAX);
    }

    proptest::proptest! {
        #[test]
        fn the_reciprocal_divides_exactly(d in 1u64..=u64::MAX, n in 0u64..=u64::MAX, bits in 1u32..=64) {
            // Divisors spread over their orders of magnitude.
            let d = (d >> (64 - bits)).max(1);
            agree(d, n);
            agree(d, n >> (n % 64));
        }
    }
}
