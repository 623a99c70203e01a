//! The Lua scripts: one per strategy family, each the exact arithmetic of `src/strategy/*.rs` in
//! microseconds, for all quotas of a key in one call.
//!
//! Lua numbers are doubles, so every number a script computes stays an integer below 2^53: the Rust
//! side checks its arguments against that bound, and the only products that could pass it (the
//! sliding window's `count * (W - e)`) go through [`PRELUDE`]'s exact `muldivmod`, which never holds
//! a value above its divisor.
//!
//! Calling convention, shared by all scripts:
//! - `KEYS`: the hash holding the key's state under its limiter's name, whatever the rule (fixed,
//!   sliding, GCRA: the state itself; moving: the rule only), then for the moving window one list
//!   per quota.
//! - `ARGV`: `op` (0 check, 1 peek, 2 settle, 3 reset, 4 a queue's step back), `cost`, `now_us` (0: use the server's `TIME`),
//!   `ttl_ms`, the strategy's code (`convert.lua`: 1 for the clock-aligned fixed window), `n`, then
//!   `limit, window, emission, burst, offset` per quota (in µs), then `at_us` (settle: the time of the check whose reservation is settled, so
//!   only its own window or bucket changes; step back: the reservation's end, which the bucket's
//!   TAT must still be), then `actual` (settle: the cost to charge; `cost` is the reservation's), then for a quota
//!   lease's return the key's reset epoch it was drawn under (a settle from another epoch changes
//!   nothing: `hash_driver.lua`).
//! - The hash records the rule's descriptor (the strategy's code and the quota arguments): a state
//!   written under another rule is converted in the script before the decision (`convert.lua`).
//! - Reply: `now_us`, then `outcome, limit, remaining, reset_after, retry_after` per quota (outcome 0
//!   allowed, 1 rejected, 2 never admissible); integers only.

/// Helpers shared by every script, the multi-limit one too: exact integer division, window starts.
const MATH: &str = include_str!("lua/math.lua");

/// The conversion of a state written under another rule (`convert.lua`), shared by every script.
const CONVERT: &str = include_str!("lua/convert.lua");

/// Helpers shared by every single-key script: [`MATH`], [`CONVERT`], then argument parsing and
/// time.
pub(super) const PRELUDE: &str = concat!(
    include_str!("lua/math.lua"),
    include_str!("lua/convert.lua"),
    include_str!("lua/prelude.lua")
);

/// The strategies keeping a few integers per quota in one hash: `run` loads the fields, applies the
/// op through the strategy's `check`, `commit` and `settle`, and writes them back.
const HASH_DRIVER: &str = include_str!("lua/hash_driver.lua");

pub(super) const FIXED: &str = include_str!("lua/fixed_window.lua");

pub(super) const SLIDING: &str = include_str!("lua/sliding_window.lua");

pub(super) const GCRA: &str = include_str!("lua/gcra.lua");

/// The moving window: one list of timestamps per quota, oldest first, at most `N` entries. Equal
/// timestamps are separate entries, so same-instant requests never collapse.
const MOVING: &str = include_str!("lua/moving_window.lua");

/// The moving window's single-key driver: applies the op to the lists with [`MOVING`]'s
/// functions.
const MOVING_DRIVER: &str = include_str!("lua/moving_driver.lua");

/// The multi-limit script's driver (after [`multi_source`]'s families): see its calling
/// convention there.
const MULTI_DRIVER: &str = include_str!("lua/multi_driver.lua");

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
        let body: &[&str] = match self {
            Family::Fixed => &[FIXED, HASH_DRIVER],
            Family::Sliding => &[SLIDING, HASH_DRIVER],
            Family::Gcra => &[GCRA, HASH_DRIVER],
            Family::Moving => &[MOVING_TTL, MOVING, MOVING_DRIVER],
        };
        let mut s = String::from(PRELUDE);
        for part in body {
            s.push_str(part);
        }
        s
    }

    /// The family's number in the multi-limit script's arguments.
    pub(super) fn code(self) -> u64 {
        match self {
            Family::Fixed => 1,
            Family::Sliding => 2,
            Family::Gcra => 3,
            Family::Moving => 4,
        }
    }
}

/// The multi-limit script ([`Store::apply_all`](crate::store::Store::apply_all) on one slot):
/// every family's own `check` and `commit`, each family's file wrapped in a function of its own
/// so that their names (`FIELDS`, `check`, ...) do not collide, sharing [`MATH`] and the
/// variables a family reads besides its arguments (`now`, `aligned`, set per item; `at` and
/// `actual`, unused: no settlement here).
///
/// Calling convention:
/// - `KEYS`: every item's Redis keys, in the items' order (one hash, then one list per quota for
///   the moving window).
/// - `ARGV`: `now_us` (0: the server's `TIME`), `m` (items), then per item `family` (1 fixed, 2
///   sliding, 3 bucket, 4 moving), `keys` (how many of `KEYS` are its own), `cost`, `ttl_ms`,
///   the strategy's code, `n`, then `limit, window, emission, burst, offset` per quota (in µs), as the
///   single-key scripts.
/// - The items are checked in order, each against all its quotas, until one does not admit; only
///   when all admit is every one committed (and written back with its TTL). Nothing is written
///   otherwise.
/// - Reply: `now_us`, `d` (the items decided: all of them, or up to the first that did not
///   admit), then the single-key scripts' five integers per quota of each decided item.
/// - Each item's state is converted first when written under another rule, and then written back
///   even when the items do not all admit.
pub(super) fn multi_source() -> String {
    let mut s = String::from(MATH);
    s.push_str(CONVERT);
    s.push_str(
        "local now = tonumber(ARGV[1])\n\
         if now == 0 then\n\
         \x20 local tm = redis.call('TIME')\n\
         \x20 now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])\n\
         end\n\
         local aligned, at, actual = false, 0, 0\n\
         local FAM = {}\n",
    );
    for (code, body) in [(1, FIXED), (2, SLIDING), (3, GCRA)] {
        s.push_str(&format!("FAM[{code}] = (function()\n"));
        s.push_str(body);
        s.push_str("return {F = FIELDS, check = check, commit = commit}\nend)()\n");
    }
    s.push_str("local MV = (function()\n");
    s.push_str(MOVING);
    s.push_str("return {check = check, commit = commit}\nend)()\n");
    s.push_str(MULTI_DRIVER);
    s
}

/// The moving window's per-quota TTL: its `W` in ms plus the same slack as the others, from `ttl_ms`
/// scaled per quota on the Rust side (`ARGV[4]` is the TTL of the longest window; each list uses its
/// own window, never less than a second past it).
const MOVING_TTL: &str = include_str!("lua/moving_ttl.lua");
