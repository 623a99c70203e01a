//! [`Settle`] markers no layer took: a layer that leaves one in a response arms a count of it,
//! which a layer around that takes the marker disarms; still armed when the response is dropped
//! (sent), it is counted in `tollgate_settle_unmatched_total{limit}` (the name the marker gives,
//! `""` when unnamed) and logged once per name. Nothing is added to a request on its way in.

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
fn unmatched(marker: &Settle) {
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

/// A marker a layer left untaken, counted when dropped while armed.
#[derive(Debug)]
struct Untaken {
    marker: Settle,
    armed: bool,
}

impl Clone for Untaken {
    /// A copy (of a response's extensions) never counts: the original does.
    fn clone(&self) -> Self {
        Self {
            marker: self.marker.clone(),
            armed: false,
        }
    }
}

impl Drop for Untaken {
    fn drop(&mut self) {
        if self.armed {
            unmatched(&self.marker);
        }
    }
}

/// Leaves `marker`, found untaken in a response's extensions `ext`, to the layers around: counted
/// when the response goes unless one of them takes it.
pub(crate) fn leave(ext: &mut http::Extensions, marker: &Settle) {
    if ext.get::<Untaken>().is_none() {
        ext.insert(Untaken {
            marker: marker.clone(),
            armed: true,
        });
    }
}

/// Takes the marker out of a response's extensions `ext` (a layer settles with it): a count an
/// inner layer armed is disarmed.
pub(crate) fn take(ext: &mut http::Extensions) -> Option<Settle> {
    if let Some(mut left) = ext.remove::<Untaken>() {
        left.armed = false;
    }
    ext.remove::<Settle>()
}
