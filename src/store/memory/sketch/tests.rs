use super::*;
use crate::decision::Outcome;

const S: u64 = 1_000_000_000;

/// A hash that lands in `bucket` with fingerprint `fp`.
fn hash_in(bucket: u64, fp: u32) -> u64 {
    (u64::from(fp) << 32) | bucket
}

fn spent(units: u64, until: u64, rank: u8) -> Spent {
    Spent { units, until, rank }
}

#[test]
fn slots_saturate_their_units_and_keep_the_rank() {
    let slot = Slot::new(7, spent(5, 3 * S + 1, 200));
    assert_eq!((slot.units(), slot.until, slot.rank()), (5, 3 * S + 1, 200));
    assert_eq!(Slot::new(7, spent(u64::MAX, S, 255)).units(), u64::MAX);
    assert_eq!(Slot::new(7, spent(UNITS_MAX, S, 0)).units(), u64::MAX);
    assert_eq!(SLOT_BYTES, 16);
}

#[test]
fn a_key_finds_its_own_record_and_no_other() {
    let sketch = Sketch::new(100);
    assert_eq!(sketch.bytes(), 0);
    let now = 1000 * S;
    assert_eq!(sketch.lookup(1, now), None);
    // 2000 records in 2^14 slots: no bucket is full, every record is held exactly.
    for k in 0..2000u64 {
        let s = spent(k % 10, now + (k % 7 + 1) * S, (k % 10 * 25) as u8);
        sketch.record(quota_hash(k, 9, 0), s, now);
    }
    assert_eq!(sketch.bytes(), MIN_SLOTS * SLOT_BYTES);
    for k in 0..2000u64 {
        let got = sketch.lookup(quota_hash(k, 9, 0), now).expect("recorded");
        assert_eq!((got.units, got.until), (k % 10, now + (k % 7 + 1) * S));
    }
    // Keys never recorded (other keys, or the same keys under another rule) find nothing.
    for k in 2000..200_000u64 {
        assert_eq!(sketch.lookup(quota_hash(k, 9, 0), now), None, "key {k}");
    }
    for k in 0..2000u64 {
        assert_eq!(sketch.lookup(quota_hash(k, 10, 0), now), None, "key {k}");
    }
    assert_eq!(sketch.lookup(quota_hash(1, 9, 0), now + 8 * S), None);
    // A record once past its time does not hold a newer one back.
    let later = now + 9 * S;
    sketch.record(quota_hash(3, 9, 0), spent(1, later + S, 25), later);
    assert_eq!(
        sketch.lookup(quota_hash(3, 9, 0), later).map(|s| s.units),
        Some(1)
    );
}

#[test]
fn a_full_bucket_gives_up_the_least_spent_share_first() {
    let sketch = Sketch::new(100);
    let now = 1000 * S;
    // Eight records of rank 100 fill bucket 5, the first expiring soonest.
    for fp in 1..=8u32 {
        let until = now + u64::from(fp) * S;
        sketch.record(hash_in(5, fp), spent(4, until, 100), now);
    }
    // A less spent share is not kept; the others stay.
    sketch.record(hash_in(5, 9), spent(1, now + 60 * S, 99), now);
    assert_eq!(sketch.lookup(hash_in(5, 9), now), None);
    for fp in 1..=8u32 {
        assert!(sketch.lookup(hash_in(5, fp), now).is_some(), "{fp}");
    }
    // Nor is as spent a share: the records held first stay.
    sketch.record(hash_in(5, 10), spent(4, now + 60 * S, 100), now);
    assert_eq!(sketch.lookup(hash_in(5, 10), now), None);
    // A more spent share takes the place of the least spent, the one expiring soonest.
    sketch.record(hash_in(5, 11), spent(9, now + 60 * S, 101), now);
    assert_eq!(sketch.lookup(hash_in(5, 1), now), None);
    assert_eq!(sketch.lookup(hash_in(5, 11), now).map(|s| s.units), Some(9));
    sketch.record(hash_in(5, 13), spent(9, now + 60 * S, 230), now);
    assert_eq!(sketch.lookup(hash_in(5, 2), now), None);
    for fp in 3..=8u32 {
        assert!(sketch.lookup(hash_in(5, fp), now).is_some(), "{fp}");
    }
    // An expired slot is free again, whatever its rank was.
    let later = now + 4 * S;
    sketch.record(hash_in(5, 12), spent(1, later + S, 0), later);
    assert_eq!(
        sketch.lookup(hash_in(5, 12), later).map(|s| s.units),
        Some(1)
    );
    // Other buckets are untouched.
    assert_eq!(sketch.lookup(hash_in(6, 3), now), None);
}

#[test]
fn a_later_summary_of_the_key_replaces_its_record() {
    let sketch = Sketch::new(100);
    let now = 1000 * S;
    let h = hash_in(3, 77);
    sketch.record(h, spent(6, now + 10 * S, 150), now);
    // The key came back (restored from its record), its window ended, it spent 1 in the next:
    // its record is that, not the old window's 6 carried on.
    sketch.record(h, spent(1, now + 70 * S, 25), now + 20 * S);
    assert_eq!(
        sketch.lookup(h, now + 20 * S),
        Some(spent(1, now + 70 * S, 25))
    );
    // A summary that counts for less long keeps the maximum (never less than the record).
    sketch.record(h, spent(0, now + 30 * S, 0), now + 21 * S);
    assert_eq!(
        sketch.lookup(h, now + 21 * S),
        Some(spent(1, now + 70 * S, 25))
    );
}

#[test]
fn a_restored_state_is_never_less_spent_than_the_evicted_one() {
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut rand = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for strategy in Strategy::ALL {
        for (limit, window) in [(10, 60 * S), (3, S), (1000, 3_600 * S), (5, S / 1000)] {
            let p = Params::bucket(limit, window, limit);
            for _ in 0..300 {
                let mut state = QuotaState::new(strategy);
                let mut now = 10_000 * S + rand() % (10 * window);
                for _ in 0..rand() % 20 {
                    now += rand() % (window / 3 + 1);
                    let cost = 1 + rand() % 3;
                    if state.check(strategy, &p, now, cost).outcome == Outcome::Allowed {
                        state.commit(strategy, &p, now, cost);
                    }
                }
                now += rand() % (window / 2 + 1);
                let Some(spent) = summary(&state, &p, now) else {
                    continue;
                };
                let mut restored = restore(strategy, &p, spent, now);
                // From `now` on, the restored state never admits more than the evicted one.
                let mut t = now;
                for _ in 0..40 {
                    let a = state.check(strategy, &p, t, 0).remaining;
                    let b = restored.check(strategy, &p, t, 0).remaining;
                    assert!(b <= a, "{strategy} {limit}/{window}: {b} > {a} at {t}");
                    t += rand() % (window / 4 + 1);
                }
            }
        }
    }
}
