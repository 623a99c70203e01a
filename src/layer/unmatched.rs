//! [`Settle`] markers no layer took: the outermost layer that sees one left in a response counts
//! it in `tollgate_settle_unmatched_total{limit}` (the name the marker gives, `""` when unnamed)
//! and logs it once per name.

use std::collections::HashSet;
use std::sync::LazyLock;

use parking_lot::Mutex;

use super::Settle;

/// The names logged so far. Names come from the application's code, but one built from request
/// data must not grow this without end: past this many, markers are no longer logged, and are
/// counted under one label, `(other)`.
const MAX_NAMES: usize = 256;

/// The `limit` label of the markers of names past [`MAX_NAMES`].
#[cfg(feature = "metrics")]
const OTHER: &str = "(other)";

static LOGGED: LazyLock<Mutex<HashSet<Box<str>>>> = LazyLock::new(Mutex::default);

/// Counts `marker`, which no layer around the request took; the first one of a name is logged.
/// The counter is resolved at each count (a rare path: an application's mistake), with the
/// recorder installed then.
#[cold]
#[inline(never)]
pub(crate) fn unmatched(marker: &Settle) {
    let name = marker.limiter().unwrap_or("");
    let mut logged = LOGGED.lock();
    let known = logged.contains(name);
    let new = !known && logged.len() < MAX_NAMES;
    if new {
        logged.insert(name.into());
    }
    drop(logged);
    // Past the cap, further names share one series: a label per name would grow without end.
    #[cfg(feature = "metrics")]
    {
        let label = if known || new { name } else { OTHER };
        metrics::counter!("tollgate_settle_unmatched_total", "limit" => label.to_owned())
            .increment(1);
    }
    if !new {
        return;
    }
    tracing::warn!(
        limit = name,
        units = marker.charged(),
        "rate limiter: a Settle marker{} reached the outermost rate-limit layer untaken: no \
         limiter{} counted this request, so its charge stands (logged once per name)",
        if name.is_empty() {
            String::new()
        } else {
            format!(" for {name:?}")
        },
        if name.is_empty() {
            " that settles unnamed markers"
        } else {
            " of that name"
        },
    );
}
