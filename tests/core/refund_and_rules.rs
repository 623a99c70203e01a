//! Settlements never free room in a later window, a key checked under another rule never
//! overflows (both found in review), and a reservation settles only where it was made.

use std::time::Duration;

use tollgate::{ManualClock, Op, Outcome, RateLimiter, Rule, Strategy};

const START: Duration = Duration::from_secs(1_700_000_040); // 00:00:00 of a minute boundary - 20 s

#[test]
fn regression_a_refund_after_the_window_edge_frees_nothing_in_the_new_window() {
    // Bug: a request admitted at :59.9 and refunded at :00.1 uncounted one in the new window, so
    // six requests passed in one window of a 5/minute limit.
    for strategy in [
        Strategy::FixedWindow,
        Strategy::SlidingWindow,
        Strategy::MovingWindow,
    ] {
        let clock =
            ManualClock::new(Duration::from_secs(1_700_000_100) - Duration::from_millis(100));
        let limiter = RateLimiter::builder()
            .strategy(strategy)
            .quotas("5/minute")
            .unwrap()
            .clock(clock.clone())
            .build()
            .unwrap();
        let late = limiter.check_now(&"k", 1);
        assert!(late.is_allowed());
        clock.advance(Duration::from_millis(200));
        // The sliding counter carries the previous bucket's weight: fill what remains.
        let mut admitted = 0;
        while limiter.check_now(&"k", 1).is_allowed() {
            admitted += 1;
        }
        limiter.settle_now(&"k", late.reservation().unwrap(), 0);
        let after = limiter.check_now(&"k", 1);
        if strategy == Strategy::FixedWindow {
            assert_eq!(admitted, 5, "{strategy}");
            assert!(
                !after.is_allowed(),
                "{strategy}: the refund freed room in the new window"
            );
        } else {
            // The refunded unit was counted in the previous bucket / is still in the log: giving it
            // back there is correct and may admit one more, never more than the limit allows.
            assert!(admitted + u32::from(after.is_allowed()) <= 5, "{strategy}");
        }
    }
}

#[test]
fn a_refund_in_the_same_window_gives_the_unit_back() {
    for strategy in Strategy::ALL {
        let clock = ManualClock::new(START);
        let limiter = RateLimiter::builder()
            .strategy(strategy)
            .quotas("2/minute")
            .unwrap()
            .clock(clock.clone())
            .build()
            .unwrap();
        let first = limiter.check_now(&"k", 1);
        assert!(limiter.check_now(&"k", 1).is_allowed());
        assert!(!limiter.check_now(&"k", 1).is_allowed(), "{strategy}");
        let d = limiter.settle_now(&"k", first.reservation().unwrap(), 0);
        assert_eq!(d.remaining(), 1, "{strategy}");
        assert!(limiter.check_now(&"k", 1).is_allowed(), "{strategy}");
    }
}

#[test]
fn a_key_keeps_one_state_across_rules_converted_on_access() {
    // A key with 500 used under 1000/hour, then checked under 100/hour (a tier downgrade): its
    // state is the limiter's and the key's, converted to the rule it is used with, so the 500
    // spent leave nothing under 100/hour, and the larger rule keeps its count when the key comes
    // back. (Regression: `limit - used` once panicked here when the rules shared a state.)
    for strategy in Strategy::ALL {
        let clock = ManualClock::new(START);
        let limiter = RateLimiter::builder()
            .strategy(strategy)
            .quotas("1000/hour")
            .unwrap()
            .clock(clock)
            .build()
            .unwrap();
        assert!(limiter.check_now(&"k", 500).is_allowed());
        let small = Rule::parse(strategy, "100/hour").unwrap();
        let d = limiter.apply_now(&"k", Some(&small), Op::Check(1));
        assert_eq!(
            (d.is_allowed(), d.remaining(), d.limit()),
            (false, 0, 100),
            "{strategy}"
        );
        let d = limiter.apply_now(&"k", Some(&small), Op::Check(101));
        assert_eq!(d.outcome(), Outcome::Exceeds, "{strategy}");
        // Back under 1000/hour: the 500 kept (a count is not capped at a lower limit; a
        // bucket's deficit cut at the smaller depth stays in a ghost of the old bucket); a leaky
        // bucket's scheduled departures (an hour ahead at the small rate: its depth) keep it
        // stricter still.
        let d = limiter.check_now(&"k", 1);
        if strategy == Strategy::LeakyBucket {
            assert!(d.is_allowed() && d.remaining() <= 499, "{strategy}: {d:?}");
        } else {
            assert_eq!((d.is_allowed(), d.remaining()), (true, 499), "{strategy}");
        }
        // A reset forgets the key's state whatever rule recorded it.
        limiter.apply_now(&"k", Some(&small), Op::Reset);
        assert_eq!(
            limiter
                .apply_now(&"k", Some(&small), Op::Check(100))
                .remaining(),
            0,
            "{strategy}"
        );
        let left = limiter.peek_now(&"k").remaining();
        if strategy == Strategy::LeakyBucket {
            assert!(left <= 900, "{strategy}: {left}");
        } else {
            assert_eq!(left, 900, "{strategy}");
        }
    }
}

#[test]
fn a_reservation_settles_only_against_the_limiter_rule_and_key_that_made_it() {
    let clock = ManualClock::new(START);
    let limiter = |name: &str| {
        RateLimiter::builder()
            .name(name)
            .strategy(Strategy::FixedWindow)
            .quotas("10/minute")
            .unwrap()
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let (a, b) = (limiter("a"), limiter("b"));
    let r = a.check_now(&1u64, 5).reservation().expect("admitted");
    assert!(b.check_now(&1u64, 1).is_allowed());
    // Another key, another limiter, another rule: refused, counted, nothing given back.
    let d = a.settle_now(&2u64, r, 0);
    assert_eq!(d.remaining(), 10, "key 2 untouched (answered as a peek)");
    assert_eq!(
        b.settle_now(&1u64, r, 0).remaining(),
        9,
        "b's key 1 untouched"
    );
    let tier = Rule::parse(Strategy::FixedWindow, "20/minute").unwrap();
    assert!(a.check_now(&1u64, 0).remaining() == 5);
    // Refused, answered as a peek of key 1's state converted to the tier: 5 of 20 spent.
    assert_eq!(
        a.apply_now(&1u64, Some(&tier), Op::settle(r, 0))
            .remaining(),
        15
    );
    assert_eq!(a.peek_now(&1u64).remaining(), 5, "a's key 1 still spent 5");
    assert_eq!((a.stats().settle_refused, b.stats().settle_refused), (2, 1));
    // Through the asynchronous entry point: an error that says why.
    let e = ready_now(a.settle(&2u64, r, 0)).expect_err("refused");
    assert_eq!(
        e.kind(),
        tollgate::StoreErrorKind::ForeignReservation,
        "{e}"
    );
    assert_eq!(a.stats().settle_refused, 3);
    // A reservation made by the store directly belongs to no limiter.
    let store_made = {
        use tollgate::store::{Scope, Store};
        let scope = Scope::new("a", a.rule());
        let now = START.as_nanos() as u64;
        let answer = a.store().apply(&1u64, scope, Op::Check(1), now);
        ready_now(answer).unwrap().reservation().unwrap()
    };
    assert_eq!(a.settle_now(&1u64, store_made, 0).remaining(), 4);
    assert_eq!(a.stats().settle_refused, 4);
    // Its own limiter, rule and key: applied.
    assert_eq!(a.settle_now(&1u64, r, 0).remaining(), 9);
    assert_eq!(a.stats().settle_refused, 4);
}

/// Polls a future that is ready at once (the memory store answers synchronously).
fn ready_now<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("the memory store answers at once"),
    }
}

#[test]
fn a_charge_beyond_a_full_moving_window_log_is_dropped_and_counted() {
    // One quota, then two whose logs fill unequally (the shared log splits): the units no log has
    // room for are counted once, as the most any quota dropped.
    for (quotas, dropped) in [("5/minute", 4), ("5/minute; 10/hour", 4), ("20/minute", 0)] {
        let limiter = RateLimiter::builder()
            .strategy(Strategy::MovingWindow)
            .quotas(quotas)
            .unwrap()
            .clock(ManualClock::new(START))
            .build()
            .unwrap();
        let r = limiter.check_now(&"k", 3).reservation().expect("admitted");
        // Reserved 3, used 9: the minute's log has room for 2 more.
        let d = limiter.settle_now(&"k", r, 9);
        let full = quotas.starts_with("5/");
        assert_eq!(d.remaining(), if full { 0 } else { 11 }, "{quotas}");
        assert_eq!(limiter.stats().settle_dropped_units, dropped, "{quotas}");
        // A settlement within the reservation drops nothing.
        let r = limiter
            .check_now(&"other", 2)
            .reservation()
            .expect("admitted");
        limiter.settle_now(&"other", r, 1);
        assert_eq!(limiter.stats().settle_dropped_units, dropped, "{quotas}");
    }
}
