//! Review of the packed first-hit grain (branch `packed-speed`, 3fbc95e..10c3726): a one-quota
//! first-hit window whose start the memory store rounds up to a grain `g = 2^k` ns. The claim is
//! "stricter, never more lenient" than the exact first-hit window.

use std::time::Duration;

use tollgate::store::MemoryStore;
use tollgate::{ManualClock, Outcome, RateLimiter, Strategy};

type Limiter = RateLimiter<&'static str, MemoryStore<&'static str>, ManualClock>;

const S: u64 = 1_000_000_000;

fn limiter(quota: &str, at: u64) -> (Limiter, ManualClock) {
    let clock = ManualClock::new(Duration::from_nanos(at));
    let limiter = RateLimiter::builder()
        .strategy(Strategy::FixedWindowFirstHit)
        .quotas(quota)
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap();
    (limiter, clock)
}

/// A charge above a reservation (`settle` for more units than reserved) takes the window's count
/// up to the limit in the exact strategy. When the reservation opened a rounded window (it was
/// made before the rounded start, in the window's first `g` ns), the packed layout drops the
/// whole settlement (`at < start` in `FixedWindow::settle`), so the extra charge is never
/// counted and the window admits up to `N - 1` more than the exact strategy: over-admission.
/// The control (the window opened on a grain boundary, so not rounded) rejects.
#[test]
fn a_charge_above_a_reservation_made_in_the_first_grain_is_counted() {
    // (quota, grain): 32768/s packs with g = 2 ns, 4294967295/s with g = 2^17 ns.
    for (quota, limit, g) in [
        ("32768/s", 32_768u32, 2u64),
        ("4294967295/s", u32::MAX, 1 << 17),
    ] {
        for off in [0, 1] {
            let t0 = (1_700_000_000 * S).div_ceil(g) * g + off;
            let (l, clock) = limiter(quota, t0);
            let d = l.check_now(&"k", 1);
            assert!(d.is_allowed(), "{quota}");
            let r = d.reservation().expect("a reservation");
            clock.set_nanos(t0 + 1000);
            // Charge the whole limit for what reserved 1: the window is spent.
            l.settle_now(&"k", r, limit);
            clock.set_nanos(t0 + 2000);
            let after = l.check_now(&"k", 1);
            assert_eq!(
                after.outcome(),
                Outcome::Rejected,
                "{quota}, window opened {off} ns after a grain boundary: the charge of {limit} \
                 for a reservation of 1 was dropped (remaining {})",
                after.remaining()
            );
        }
    }
}
