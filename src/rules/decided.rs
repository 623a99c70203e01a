//! What a rules file's limits decided for a request, and the answer that carries it (at once, or
//! later from a remote store).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::enforce::{Held, Holds, PENDING};
use super::slots::Slots;
use crate::Decision;
use crate::error::StoreError;

/// What a rules file's limits decided for a request.
#[derive(Clone)]
pub struct RulesDecided {
    /// The enforced limits (shaping queues included) that admitted the request.
    pub(super) held: Holds,
    /// The rejecting limit (the longest wait) and its decision.
    pub(super) rejected: Option<(usize, Decision)>,
    /// What shadow limits and shaping queues add, when the request met any (boxed: the common
    /// decision stays small, and it is moved through the response future's states).
    pub(super) extra: Option<Box<Extra>>,
}

/// The shadow limits and the shaping queue of a request's decision.
#[derive(Clone, Default)]
pub(super) struct Extra {
    /// The shadow limits that admitted it: settled like enforced ones.
    pub(super) shadows: Vec<Held>,
    /// The shadow decision to report (fewest remaining).
    pub(super) shadow: Option<(usize, Decision)>,
    /// How long it waits for its departure (a shaping queue).
    pub(super) wait: Duration,
    /// The concurrency slots it holds until its response body ends (or it is dropped).
    pub(super) slots: Option<Arc<Slots>>,
}

/// The decision of a request no enforced limit counted (none matched with a key, or its store
/// failed open): admitted, holding nothing.
pub(super) const ADMITTED: Decision = Decision {
    outcome: crate::Outcome::Allowed,
    ..PENDING
};

impl RulesDecided {
    pub(super) fn admitted(held: Holds) -> Self {
        Self {
            held,
            rejected: None,
            extra: None,
        }
    }

    pub(super) fn shadows(&self) -> &[Held] {
        self.extra.as_ref().map_or(&[], |e| e.shadows.as_slice())
    }

    pub(super) fn rejected(index: usize, d: Decision) -> Self {
        Self {
            rejected: Some((index, d)),
            ..Self::admitted(Holds::default())
        }
    }
}

/// Why a file's decision stopped before forwarding: a limit rejected, or a store failed closed
/// (every reservation given back).
pub(super) enum Stop {
    Rejected(usize, Decision),
    Failed(StoreError),
}

pub(super) type Boxed = Pin<Box<dyn Future<Output = Result<RulesDecided, StoreError>> + Send>>;

/// A rules file's decision or settlement: known at once (one limit on the memory store), or later.
pub enum RulesAnswer {
    #[doc(hidden)]
    Now(Option<Result<RulesDecided, StoreError>>),
    #[doc(hidden)]
    Later(Boxed),
}

impl Future for RulesAnswer {
    type Output = Result<RulesDecided, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Self::Now(result) => Poll::Ready(result.take().unwrap_or_else(|| {
                Err(StoreError::new(
                    crate::StoreErrorKind::Other,
                    "a rules decision polled after it completed",
                ))
            })),
            Self::Later(fut) => fut.as_mut().poll(cx),
        }
    }
}

impl std::fmt::Debug for RulesDecided {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RulesDecided")
            .field("held", &self.held.len())
            .field("rejected", &self.rejected)
            .field("shadows", &self.shadows().len())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for RulesAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Now(result) => f.debug_tuple("Now").field(result).finish(),
            Self::Later(_) => f.write_str("Later(..)"),
        }
    }
}
