//! The stacked-layer marker: the limiters and keys a request was counted under, carried in its
//! extensions, so that a second layer on the same limiter and key lets it through uncounted; and
//! the innermost admitting layer's [`Decision`], which a handler reads with
//! [`Decision::from_extensions`] (or as an axum extractor).

use std::hash::{BuildHasher, Hasher};

use crate::clock::Clock;
use crate::decision::Decision;
use crate::limiter::RateLimiter;
use crate::store::Store;

/// The limiters and keys a request was counted under, so stacked layers count it once, and the
/// decision that admitted it. Kept inline: one extension per request, whatever it carries; past
/// [`Counted::MAX`] layers a request is counted again.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counted {
    ids: [CountId; Counted::MAX],
    len: u8,
    /// The decision of the innermost layer that admitted the request (`None`: it passed on a
    /// store failure, failing open).
    decision: Option<Decision>,
}

/// Marks a request as counted under `id`, admitted by `decision`, before it is forwarded.
/// `marked`: whether it arrived marked by an enclosing layer (known from the layer's own look-up;
/// unmarked, one insert).
pub(crate) fn mark_counted(
    extensions: &mut http::Extensions,
    id: CountId,
    marked: bool,
    decision: Option<Decision>,
) {
    let existing = if marked {
        extensions.get_mut::<Counted>()
    } else {
        None
    };
    match existing {
        Some(c) => {
            c.push(id);
            c.decision = decision;
        }
        None => {
            let mut c = Counted {
                decision,
                ..Counted::default()
            };
            c.push(id);
            extensions.insert(c);
        }
    }
}

impl Decision {
    /// The decision that admitted a request, from the request's extensions: what a handler behind
    /// a [`RateLimitLayer`](crate::layer::RateLimitLayer) shows as "attempts left" (with axum,
    /// take `Decision` or `Option<Decision>` as an extractor instead). With stacked layers, the
    /// innermost one's. `None` when no layer decided the request (none applies, it was skipped, or
    /// it passed on a store failure); a rules file's layer does not carry one (see
    /// `tollgate::rules::Rules::peek`).
    ///
    /// The decision rides in the layer's own marker rather than as an extension of its own: one
    /// insert per request instead of two.
    pub fn from_extensions(extensions: &http::Extensions) -> Option<Decision> {
        extensions.get::<Counted>().and_then(|c| c.decision)
    }
}

/// `Decision` as an axum extractor: the decision that admitted the request (see
/// [`Decision::from_extensions`]); `500 Internal Server Error` when there is none (the handler is
/// not behind a layer that decided it: `Option<Decision>` takes that case).
#[cfg(feature = "axum")]
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Decision {
    type Rejection = (http::StatusCode, &'static str);

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Decision::from_extensions(&parts.extensions).ok_or((
            http::StatusCode::INTERNAL_SERVER_ERROR,
            "no rate-limit decision for this request: is the handler behind a RateLimitLayer?",
        ))
    }
}

/// `Option<Decision>` as an axum extractor: `None` when no layer decided the request.
#[cfg(feature = "axum")]
impl<S: Send + Sync> axum::extract::OptionalFromRequestParts<S> for Decision {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(Decision::from_extensions(&parts.extensions))
    }
}

impl Counted {
    const MAX: usize = 4;

    pub(crate) fn contains(&self, id: CountId) -> bool {
        self.ids
            .iter()
            .take(usize::from(self.len))
            .any(|&x| x == id)
    }

    fn push(&mut self, id: CountId) {
        if let Some(slot) = self.ids.get_mut(usize::from(self.len)) {
            *slot = id;
            self.len += 1;
        }
    }
}

/// A request's identity under one limiter and rule: one seeded hash of the store's address, the
/// rule's address and the key (the seed is random per process). Two ids collide only by a chance
/// of about 2^-64 that nobody can aim (a collision would let a request pass a second layer
/// uncounted). One word, not three: the marker and the future stay small.
pub(crate) type CountId = u64;

pub(crate) fn counted_id<K: crate::store::StoreKey, St: Store<K>, C: Clock>(
    limiter: &RateLimiter<K, St, C>,
    rule: &crate::rule::Rule,
    key: &K,
) -> CountId {
    static HASHER: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
    // The store lives inside the limiter's shared allocation: its address names the limiter. The
    // rule's address tells a route's own rule (`select_rule`) from the limiter's.
    let mut h = HASHER.get_or_init(Default::default).build_hasher();
    h.write_usize(std::ptr::from_ref(limiter.store()) as usize);
    h.write_usize(std::ptr::from_ref(rule) as usize);
    key.hash(&mut h);
    h.finish()
}
