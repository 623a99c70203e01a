use super::*;

#[test]
fn the_lease_cap_is_a_share_of_the_smallest_limit_and_at_least_one() {
    let rule = Rule::parse(Strategy::SlidingWindow, "1000/minute; 100/second").unwrap();
    let params = rule.params_in(TICK_NANOS).unwrap();
    assert_eq!(Leasing::default().cap(Strategy::SlidingWindow, &params), 5);
    assert_eq!(
        Leasing::default()
            .max_share(1000)
            .cap(Strategy::SlidingWindow, &params),
        1
    );
}

#[test]
fn lease_sizes_follow_demand_grow_at_most_fourfold_and_stay_under_the_cap() {
    let cfg = Leasing::default().horizon(Duration::from_millis(100));
    let mut slot = Slot {
        lease: None,
        fetching: None,
        done: 0,
        last: Fetched::Nothing,
        size: 0,
        asked: 0,
        since: 0,
        cap: 500,
        used_at: Instant::now(),
        now_seen: 0,
        back: Arc::new(Back {
            base: String::new(),
            rule: Rule::parse(Strategy::FixedWindow, "10000/minute").unwrap(),
            tag: 0,
        }),
    };
    let ms = 1_000_000;
    assert_eq!(
        slot.next_size(&cfg, 1000 * ms, 1),
        1,
        "a new key gets one unit"
    );
    slot.asked = 1000;
    assert_eq!(
        slot.next_size(&cfg, 1010 * ms, 1),
        4,
        "growth is at most 4x"
    );
    slot.asked = 1000;
    assert_eq!(slot.next_size(&cfg, 1020 * ms, 1), 16);
    slot.asked = 1;
    assert_eq!(
        slot.next_size(&cfg, 2020 * ms, 3),
        3,
        "a cold key's lease falls to the cost"
    );
    slot.size = 400;
    slot.asked = 1_000_000;
    assert_eq!(slot.next_size(&cfg, 2030 * ms, 1), 500, "the cap");
}

#[test]
fn a_lease_admits_until_it_is_empty_or_dead_and_returns_the_rest() {
    let mut lease = Lease {
        left: 3,
        granted: 5,
        at: 7_000,
        sent: 100,
        until: 1_100,
        until_i: Instant::now() + Duration::from_secs(60),
        fresh: 1_000,
        fresh_i: Instant::now() + Duration::from_secs(30),
        epoch: 0,
        end: 8_000,
        bucket: false,
        limit: 10,
        remaining: 5,
        reset_after: 1_000,
        quota: 0,
    };
    let i = Instant::now();
    let d = lease.take(2, 600, i, false).unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 6);
    assert_eq!(d.time, 7_500, "the time inside the lease's window");
    assert!(lease.take(2, 700, i, false).is_none(), "one unit left");
    assert!(
        lease.take(1, 1_000, i, false).is_none(),
        "due for renewal before its death at 1_100"
    );
    assert!(
        lease.alive(1_000, i),
        "a lease due for renewal is still alive"
    );
    assert!(
        lease.take(1, 1_000, i, true).is_some(),
        "a check that waited for its renewal takes from it"
    );
    assert!(
        lease.take(1, 1_100, i, true).is_none(),
        "never from a dead lease"
    );
    lease.left += 1;
    let mut stale = lease;
    stale.fresh_i = i;
    assert!(
        stale.take(1, 700, i, false).is_none(),
        "due for renewal on the monotonic clock, whatever the limiter's clock says"
    );
    assert_eq!(
        lease.give_back(),
        Some(Op::Settle {
            reserved: 5,
            actual: 4,
            at: 7_000,
            bound: 0
        })
    );
    lease.left = 0;
    assert_eq!(lease.give_back(), None);
}

#[test]
fn leasing_is_refused_for_the_moving_window_first_hit_window_and_leaky_bucket() {
    for s in Strategy::ALL {
        let leasable = matches!(
            s,
            Strategy::FixedWindow | Strategy::SlidingWindow | Strategy::TokenBucket
        );
        assert_eq!(refusal(s).is_none(), leasable, "{s}");
    }
}
