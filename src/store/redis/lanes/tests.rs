use super::*;
use std::time::Duration;

fn lanes(max_in_flight: usize) -> Arc<Lanes> {
    Arc::new(Lanes::new(
        Arc::new(Semaphore::new(max_in_flight)),
        max_in_flight,
    ))
}

#[tokio::test(start_paused = true)]
async fn a_key_redis_has_not_admitted_gets_two_and_other_keys_are_not_held() {
    let lanes = lanes(256);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(50);
    let places: Vec<_> = (0..PER_KEY + 1).map(|_| lanes.enter(7)).collect();
    let turns: Vec<_> = places.iter().filter_map(Place::try_admit).collect();
    assert_eq!(turns.len(), PER_KEY);
    assert!(
        places[PER_KEY].admit(deadline).await.is_none(),
        "the third waits"
    );
    let other = lanes.enter(8);
    assert!(other.try_admit().is_some(), "another key is not held");
    drop(turns);
    assert!(places[PER_KEY].try_admit().is_some());
}

#[test]
fn a_key_alone_takes_three_quarters_of_the_slots_and_leaves_a_quarter_to_others() {
    let lanes = lanes(256);
    let places: Vec<_> = (0..256).map(|_| lanes.enter(7)).collect();
    places[0].lane().unwrap().admitted(1_000_000);
    let turns: Vec<_> = places.iter().filter_map(Place::try_admit).collect();
    // Its first two take their slots of the gate when sent (not here): 190 past them.
    assert_eq!(turns.len(), 256 - 64, "all but the reserve");
    assert_eq!(lanes.gate.available_permits(), 64 + PER_KEY);
    // Another flooding key: its first two, then no more past the reserve.
    let others: Vec<_> = (0..4).map(|_| lanes.enter(8)).collect();
    others[0].lane().unwrap().admitted(1_000_000);
    let theirs: Vec<_> = others.iter().filter_map(Place::try_admit).collect();
    assert_eq!(theirs.len(), PER_KEY);
}

#[test]
fn a_take_past_a_keys_first_two_never_holds_the_reserve_even_for_a_moment() {
    // 8 slots, a reserve of 2: a key alone takes 4 past its first two (whose slots are taken
    // when sent), each only while 2 + 2 + 1 are free. A take holds only its own slot
    // throughout: anything looking at the gate meanwhile (the store's `in_flight`, another
    // key's check) never sees fewer than the reserve and the first two free.
    let lanes = lanes(8);
    let places: Vec<_> = (0..8).map(|_| lanes.enter(7)).collect();
    places[0].lane().unwrap().admitted(1_000_000);
    let turns: Vec<_> = places.iter().filter_map(Place::try_admit).collect();
    assert_eq!(turns.len(), 8 - 2, "two, and four past them");
    assert_eq!(lanes.gate.available_permits(), 2 + PER_KEY);
    let fewest = lanes.fewest_free.load(Ordering::Relaxed);
    assert_eq!(fewest, 2 + PER_KEY, "a take held more than its slot");
}

#[test]
fn flooding_keys_on_threads_never_see_the_reserve_taken() {
    // Four keys, each with its first two in flight (their slots not yet taken), take and give
    // back slots past them on four threads: whatever the interleaving, the gate keeps the
    // reserve and the first two free at every look, not only between takes.
    let lanes = lanes(16);
    let floor = reserve(16) + PER_KEY;
    std::thread::scope(|s| {
        for key in 0..4 {
            let lanes = &lanes;
            s.spawn(move || {
                let places: Vec<_> = (0..6).map(|_| lanes.enter(key)).collect();
                places[0].lane().unwrap().admitted(1_000_000);
                let _first_two: Vec<_> = places[..PER_KEY]
                    .iter()
                    .filter_map(Place::try_admit)
                    .collect();
                for _ in 0..20_000 {
                    let turns: Vec<_> = places[PER_KEY..]
                        .iter()
                        .filter_map(Place::try_admit)
                        .collect();
                    assert!(lanes.gate.available_permits() >= floor);
                    drop(turns);
                }
            });
        }
    });
    assert!(lanes.fewest_free.load(Ordering::Relaxed) >= floor);
    assert!(
        lanes.peak() > PER_KEY as u64,
        "the keys took slots past two"
    );
}

#[test]
fn a_key_past_two_stays_within_what_redis_left_it_and_falls_back_to_two_when_narrowed() {
    let lanes = lanes(256);
    let places: Vec<_> = (0..20).map(|_| lanes.enter(7)).collect();
    let lane = places[0].lane().unwrap();
    lane.admitted(3 * ROOM_SHARE + ROOM_SHARE - 1);
    let mut turns: Vec<_> = places.iter().filter_map(Place::try_admit).collect();
    assert_eq!(
        turns.len(),
        PER_KEY + 3,
        "two, and a 64th of the quota left"
    );
    assert_eq!(lanes.peak(), 5);
    lane.narrow();
    turns.truncate(2);
    assert!(places.iter().all(|p| p.try_admit().is_none()));
    drop(turns.pop());
    assert!(places[0].try_admit().is_some(), "its first two remain");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_takes_the_turn_of_an_answered_call() {
    let lanes = lanes(4);
    let (a, b, c) = (lanes.enter(1), lanes.enter(1), lanes.enter(1));
    let first = a.try_admit().unwrap();
    let _second = b.try_admit().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(50);
    let waiter = async { c.admit(deadline).await.is_some() };
    let answer = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(first);
    };
    let (admitted, ()) = tokio::join!(waiter, answer);
    assert!(admitted);
}

#[test]
fn a_lane_is_dropped_with_its_last_check() {
    let lanes = lanes(256);
    let a = lanes.enter(1);
    let b = lanes.enter(1);
    let turn = a.try_admit().unwrap();
    let slot = a.into_slot(turn);
    drop(b);
    assert_eq!(lanes.len(), 1, "the slot keeps the lane");
    drop(slot);
    assert_eq!(lanes.len(), 0);
    let again = lanes.enter(1);
    assert!(again.lane().unwrap().unqueued());
    let turns: Vec<_> = (0..PER_KEY + 1)
        .map(|_| lanes.enter(1))
        .map(|p| {
            p.lane().unwrap().admitted(100 * ROOM_SHARE);
            let t = p.try_admit().unwrap();
            p.into_slot(t)
        })
        .collect();
    assert!(
        !again.lane().unwrap().unqueued(),
        "{} calls in flight",
        turns.len()
    );
}
