//! Redis errors as [`StoreError`]s.

use ::redis::{ErrorKind, RedisError};

use crate::error::{StoreError, StoreErrorKind};

/// A failed call's error: owned, it is kept as the [`StoreError`]'s cause; borrowed, a copy of its
/// kind and text is.
pub(super) trait RedisFailure {
    fn error(&self) -> &RedisError;
    fn into_cause(self) -> RedisError;
}

impl RedisFailure for RedisError {
    fn error(&self) -> &RedisError {
        self
    }

    fn into_cause(self) -> RedisError {
        self
    }
}

impl RedisFailure for &RedisError {
    fn error(&self) -> &RedisError {
        self
    }

    fn into_cause(self) -> RedisError {
        RedisError::from((self.kind(), "Redis", self.to_string()))
    }
}

/// The [`StoreError`] of a failed call, with the Redis error as its cause.
pub(super) fn map_error(e: impl RedisFailure) -> StoreError {
    let kind = error_kind(e.error());
    let message = e.error().to_string();
    StoreError::new(kind, message).with_source(e.into_cause())
}

/// The class of a failed call's error.
pub(super) fn error_kind(e: &RedisError) -> StoreErrorKind {
    if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::ClusterDown
                | ErrorKind::MasterDown
                | ErrorKind::TryAgain
                | ErrorKind::BusyLoadingError
                | ErrorKind::ClusterConnectionNotFound
        )
    {
        StoreErrorKind::Connection
    } else if matches!(e.kind(), ErrorKind::TypeError | ErrorKind::ParseError) {
        StoreErrorKind::BadReply
    } else {
        StoreErrorKind::Server
    }
}
