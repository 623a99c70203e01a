//! The Lua scripts: one per strategy family, each the exact arithmetic of `src/strategy/*.rs` in
//! microseconds, for all quotas of a key in one call.
//!
//! Lua numbers are doubles, so every number a script computes stays an integer below 2^53: the Rust
//! side checks its arguments against that bound, and the only products that could pass it (the
//! sliding window's `count * (W - e)`) go through [`PRELUDE`]'s exact `muldivmod`, which never holds
//! a value above its divisor.
//!
//! Calling convention, shared by all scripts:
//! - `KEYS`: the hash holding the key's state (fixed, sliding, GCRA), or one list per quota (moving).
//! - `ARGV`: `op` (0 check, 1 peek, 2 settle, 3 reset, 4 a queue's step back), `cost`, `now_us` (0: use the server's `TIME`),
//!   `ttl_ms`, `aligned` (fixed window: 1 for clock-aligned), `n`, then `limit, window, emission, burst`
//!   per quota (in µs), then `at_us` (settle: the time of the check whose reservation is settled, so
//!   only its own window or bucket changes; step back: the reservation's end, which the bucket's
//!   TAT must still be), then `actual` (settle: the cost to charge; `cost` is the reservation's).
//! - Reply: `now_us`, then `outcome, limit, remaining, reset_after, retry_after` per quota (outcome 0
//!   allowed, 1 rejected, 2 never admissible); integers only.

/// Helpers shared by every script: argument parsing, time, exact integer division.
pub(super) const PRELUDE: &str = include_str!("lua/prelude.lua");

/// The strategies keeping a few integers per quota in one hash: `run` loads the fields, applies the
/// op through the strategy's `check`, `commit` and `settle`, and writes them back.
const HASH_DRIVER: &str = include_str!("lua/hash_driver.lua");

pub(super) const FIXED: &str = include_str!("lua/fixed_window.lua");

pub(super) const SLIDING: &str = include_str!("lua/sliding_window.lua");

pub(super) const GCRA: &str = include_str!("lua/gcra.lua");

/// The moving window: one list of timestamps per quota, oldest first, at most `N` entries. Equal
/// timestamps are separate entries, so same-instant requests never collapse.
const MOVING: &str = include_str!("lua/moving_window.lua");

/// Which script a strategy runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Family {
    Fixed,
    Moving,
    Sliding,
    Gcra,
}

impl Family {
    pub(super) const ALL: [Family; 4] =
        [Family::Fixed, Family::Moving, Family::Sliding, Family::Gcra];

    /// The full Lua source of the family's script.
    pub(super) fn source(self) -> String {
        let body: [&str; 2] = match self {
            Family::Fixed => [FIXED, HASH_DRIVER],
            Family::Sliding => [SLIDING, HASH_DRIVER],
            Family::Gcra => [GCRA, HASH_DRIVER],
            Family::Moving => [MOVING_TTL, MOVING],
        };
        let mut s = String::from(PRELUDE);
        for part in body {
            s.push_str(part);
        }
        s
    }
}

/// The moving window's per-quota TTL: its `W` in ms plus the same slack as the others, from `ttl_ms`
/// scaled per quota on the Rust side (`ARGV[4]` is the TTL of the longest window; each list uses its
/// own window, never less than a second past it).
const MOVING_TTL: &str = include_str!("lua/moving_ttl.lua");
