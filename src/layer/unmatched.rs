//! [`Settle`] markers no layer took: the outermost layer that sees one left in a response counts
//! it in `tollgate_settle_unmatched_total{limit}` (the name the marker gives, `""` when unnamed)
//! and logs it once per name.

use std::collections::HashMap;
use std::sync::LazyLock;

use parking_lot::Mutex;

use super::Settle;

/// The names seen so far, with their counter (resolved once per name). Names come from the
/// application's code, but one built from request data must not grow this without end: past
/// this many, a marker is counted without being remembered (and not logged).
const MAX_NAMES: usize = 256;

#[cfg(feature = "metrics")]
type Handle = metrics::Counter;
#[cfg(not(feature = "metrics"))]
type Handle = ();

static SEEN: LazyLock<Mutex<HashMap<Box<str>, Handle>>> = LazyLock::new(Mutex::default);

/// Counts `marker`, which no layer around the request took; the first one of a name is logged.
#[cold]
#[inline(never)]
pub(crate) fn unmatched(marker: &Settle) {
    let name = marker.limiter().unwrap_or("");
    let mut seen = SEEN.lock();
    if let Some(handle) = seen.get(name) {
        count(handle);
        return;
    }
    let handle = resolve(name);
    count(&handle);
    if seen.len() < MAX_NAMES {
        tracing::warn!(
            limit = name,
            units = marker.charged(),
            "rate limiter: a Settle marker{} reached the outermost rate-limit layer untaken: \
             no limiter{} counted this request, so its charge stands (logged once per name)",
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
        seen.insert(name.into(), handle);
    }
}

#[cfg(feature = "metrics")]
fn resolve(name: &str) -> Handle {
    metrics::counter!("tollgate_settle_unmatched_total", "limit" => name.to_owned())
}

#[cfg(not(feature = "metrics"))]
fn resolve(_name: &str) -> Handle {}

#[cfg(feature = "metrics")]
fn count(handle: &Handle) {
    handle.increment(1);
}

#[cfg(not(feature = "metrics"))]
fn count(_handle: &Handle) {}
