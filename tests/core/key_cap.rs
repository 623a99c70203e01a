//! The key cap without amnesia (issue 17, points 1, 2 and 5), through the public `RateLimiter` API
//! on a `ManualClock`:
//!
//! - a flood of 10x the cap of new keys gives a key that spent 9 of 10 at most its 1 left, for
//!   every strategy, whether the key stays held (eviction takes the keys nearest a new key's state
//!   first) or is evicted and comes back (restored from the sketch of spent quota);
//! - the false-reject bound: after the flood, returning flood keys (1 of 10 spent) are over-counted
//!   by at most 1 and rarely; the sketch stays within its stated bytes;
//! - small caps: with a cap of 2, 40 keys at 5/minute all get in, and nothing goes to the overflow
//!   quota (no "full of blocked keys" warning);
//! - the default cap.

use crate::oracle;

use oracle::{Limiter, S};
use tollgate::store::{DEFAULT_MAX_KEYS, MAX_SKETCH_BYTES, MemoryStore};
use tollgate::{ManualClock, RateLimiter, Strategy};

const DAY: u64 = 19_675 * 86_400 * S;

fn capped(strategy: Strategy, quota: &str, max_keys: usize) -> (Limiter, ManualClock) {
    let clock = ManualClock::default();
    clock.set_nanos(DAY + 7 * S);
    let l = RateLimiter::builder()
        .strategy(strategy)
        .quota(oracle::q(quota))
        .max_keys(max_keys)
        .clock(clock.clone())
        .build()
        .expect("valid rule");
    (l, clock)
}

/// Admissions of `key` out of `tries` requests of cost 1.
fn admitted(l: &Limiter, key: u64, tries: usize) -> usize {
    (0..tries)
        .filter(|_| l.check_now(&key, 1).is_allowed())
        .count()
}

/// A client spends 9 of its 10 an hour, then `flood` new keys spend 1 each, a millisecond apart.
fn spend_nine_then_flood(l: &Limiter, clock: &ManualClock, client: u64, flood: u64) {
    assert!(l.check_now(&client, 9).is_allowed());
    for k in 0..flood {
        clock.advance(std::time::Duration::from_millis(1));
        assert!(l.check_now(&k, 1).is_allowed(), "flood key {k}");
    }
}

#[test]
fn a_flood_of_ten_times_the_cap_gives_a_spent_key_nothing_back() {
    let cap = 200;
    for strategy in Strategy::ALL {
        let (l, clock) = capped(strategy, "10/hour", cap);
        let client = u64::MAX;
        spend_nine_then_flood(&l, &clock, client, 10 * cap as u64);
        assert!(l.store().len() <= cap + 1, "{strategy}: the cap holds");
        assert!(
            l.stats().evictions > 0,
            "{strategy}: room was made by evicting"
        );
        assert_eq!(l.stats().overflow_hits, 0, "{strategy}: no key was full");
        assert!(
            admitted(&l, client, 20) <= 1,
            "{strategy}: the client got back quota it had spent"
        );
        // The false-reject bound: a returning flood key (1 of 10 spent) is counted as having spent
        // at most what the keys it collides with in every probe of the sketch spent: 1 each, 2
        // for those already back. With ~2000 records in 2^15 cells and 8 probes, about 5 x 10^-4
        // of the keys collide so (~1 of 2000 expected); 2% would be far outside the bound.
        // A key that came back over-counted leaves a record one unit higher when it is evicted
        // again, so a later key whose every cell holds such a record is over-counted by 2: a
        // collision of collisions (seen about once in 200 runs of this test, with the store's
        // random hash seed), never more than two keys in a run.
        clock.advance(std::time::Duration::from_secs(1));
        let flood = 10 * cap as u64;
        let (mut over_counted, mut over_counted_twice) = (0, 0);
        for k in 0..flood {
            let d = l.check_now(&k, 1);
            assert!(d.is_allowed(), "{strategy}: flood key {k}: {d:?}");
            assert!(d.remaining() >= 6, "{strategy}: flood key {k}: {d:?}");
            over_counted += u64::from(d.remaining() < 8);
            over_counted_twice += u64::from(d.remaining() < 7);
        }
        assert!(
            over_counted <= flood / 50 && over_counted_twice <= 2,
            "{strategy}: {over_counted} of {flood} returning keys over-counted, \
             {over_counted_twice} by 2"
        );
        eprintln!("{strategy}: {over_counted} of {flood} returning flood keys over-counted by 1");
        let sketch = l.store().sketch_bytes();
        assert!(
            sketch == 256 * 1024 && sketch <= MAX_SKETCH_BYTES / 256,
            "{strategy}: {sketch} bytes"
        );
    }
}

#[test]
fn an_evicted_key_comes_back_as_spent_as_it_left() {
    // A cap of 1: each flood key evicts the one before it, and the first evicts the client.
    for strategy in Strategy::ALL {
        let (l, clock) = capped(strategy, "10/hour", 1);
        let client = u64::MAX;
        spend_nine_then_flood(&l, &clock, client, 10);
        assert_eq!(l.store().len(), 1, "{strategy}");
        assert!(
            l.stats().evictions >= 10,
            "{strategy}: the client was evicted"
        );
        assert!(l.store().sketch_bytes() > 0, "{strategy}: recorded");
        assert!(
            admitted(&l, client, 20) <= 1,
            "{strategy}: the evicted client got back quota it had spent"
        );
    }
}

#[test]
fn an_evicted_key_is_free_again_when_its_state_would_have_been() {
    // The record of an evicted key expires with the state it stands for: after the horizon (plus
    // the sketch's millisecond), the key has its whole limit again.
    for strategy in Strategy::ALL {
        let (l, clock) = capped(strategy, "10/minute", 1);
        let client = u64::MAX;
        assert!(l.check_now(&client, 9).is_allowed());
        clock.advance(std::time::Duration::from_secs(1));
        assert!(
            l.check_now(&1, 1).is_allowed(),
            "{strategy}: evicts the client"
        );
        assert!(l.check_now(&client, 1).is_allowed(), "{strategy}: its 10th");
        assert!(!l.check_now(&client, 1).is_allowed(), "{strategy}");
        let horizon = l.rule().horizon();
        clock.advance(horizon + std::time::Duration::from_millis(2));
        assert!(l.check_now(&client, 10).is_allowed(), "{strategy}");
    }
}

#[test]
fn with_a_cap_of_two_forty_keys_at_five_per_minute_all_get_in() {
    for strategy in Strategy::ALL {
        let (l, clock) = capped(strategy, "5/minute", 2);
        for k in 0..40 {
            clock.advance(std::time::Duration::from_millis(100));
            let d = l.check_now(&k, 1);
            assert!(d.is_allowed(), "{strategy}: key {k}: {d:?}");
        }
        assert_eq!(
            l.stats().overflow_hits,
            0,
            "{strategy}: nothing went to the overflow quota (no full-of-blocked-keys warning)"
        );
        assert!(l.store().len() <= 2);
        // Every key comes back as it left: 1 of 5 spent (the sketch recalls it).
        clock.advance(std::time::Duration::from_secs(1));
        for k in 0..40 {
            let d = l.check_now(&k, 1);
            assert_eq!(
                (d.is_allowed(), d.remaining()),
                (true, 3),
                "{strategy}: key {k}"
            );
        }
        assert_eq!(l.stats().overflow_hits, 0, "{strategy}");
    }
}

#[test]
fn the_store_is_capped_by_default_and_the_cap_can_be_lifted() {
    let store = MemoryStore::<u64>::new();
    assert_eq!(store.max_keys(), Some(DEFAULT_MAX_KEYS));
    assert_eq!(DEFAULT_MAX_KEYS, 8_000_000);
    let built: MemoryStore<u64> = MemoryStore::<u64>::builder().build();
    assert_eq!(built.max_keys(), Some(DEFAULT_MAX_KEYS));
    let lifted: MemoryStore<u64> = MemoryStore::<u64>::builder().max_keys(usize::MAX).build();
    assert_eq!(lifted.max_keys(), None);
    let l: Limiter = RateLimiter::builder()
        .quota(oracle::q("1/s"))
        .clock(ManualClock::default())
        .build()
        .expect("valid rule");
    assert_eq!(l.store().max_keys(), Some(DEFAULT_MAX_KEYS));
    assert_eq!(
        store.sketch_bytes(),
        0,
        "nothing allocated before an eviction"
    );
}
