//! One script call under the store's overload and outage policies, shared by plain calls
//! (`apply_base`) and lease fetches (`quota_lease.rs`), so the two cannot drift apart: the circuit
//! breaker (its probe, and the Cluster rebuild when a probe fails), a slot among the calls in
//! flight, the timeout, overload told apart from an outage, and the connection's health.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ::redis::{ErrorKind, Value};
use tokio::sync::oneshot;

use super::lanes::Slot;
use std::time::Duration;

/// How much past the timeout a check of a key that is not flooding (no check of it waiting in its
/// lane) waits for its reply while Redis answers others, instead of being shed.
pub(super) const UNQUEUED_GRACE: Duration = Duration::from_millis(500);
use super::{
    LATE_GRACE, Pass, RedisStore, SILENCE, WARN_EVERY, error_kind, map_error, nanos, rebuild,
};
use crate::error::{StoreError, StoreErrorKind};

/// What to do with a reply that came after its caller gave up (given the reply and whether the
/// caller was answered "shed"): the arguments of a call to the same script and keys that gives its
/// quota back, if any. Sent on the call's task, which keeps its in-flight slot meanwhile.
pub(super) type Refund = Box<dyn FnOnce(&Value, bool) -> Option<Vec<u64>> + Send>;

/// One script call: the Redis keys, the arguments, and the script's hash and source.
pub(super) struct Script {
    pub(super) keys: Vec<String>,
    pub(super) args: Vec<u64>,
    pub(super) sha: String,
    pub(super) src: Arc<str>,
}

/// Why a check was shed (answered locally as a rejection, never admitted), for the counters and
/// the warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shed {
    /// Its key's own checks held the key's share of the calls in flight until the deadline
    /// (`lanes.rs`): the key's own flood.
    OwnKey,
    /// No room among the calls in flight until the deadline, while Redis answered others.
    NoRoom,
    /// Sent, and no reply within the timeout while Redis answered others (or this process was
    /// starved).
    Slow,
}

/// How a call ended without a reply to use.
#[derive(Debug)]
pub(super) enum NoReply {
    /// No slot or no reply in time while Redis answers others: overload (only for calls sent
    /// with `sheddable`); the caller answers "shed", never admits.
    Overload(Shed),
    /// Redis failed, the breaker is open, or there is no connection: the failure policy answers.
    Outage(StoreError),
    /// A call that is never shed (a settlement, a reset, a peek) got no slot or no reply in time
    /// while Redis answered others: overload, not an outage (the breaker does not count it). The
    /// request was decided already; the caller gets the error (a refund Redis does not apply
    /// leaves its estimate charged). Counted in `settle_timed_out`.
    Late(StoreError),
}

impl RedisStore {
    /// Sends `script` and waits for its reply until `deadline`.
    ///
    /// The call runs on its own task holding its in-flight slot until the reply comes (or the
    /// connection's own timeout, `LATE_GRACE` past ours): a caller that gives up does not free the
    /// slot of a call still queued in front of Redis. A failed probe of the open circuit starts
    /// the Cluster rebuild. With `sheddable`, a slow call while Redis answers others is
    /// [`NoReply::Overload`]. A reply that comes after the caller gave up goes to `refund`. The
    /// key's `lane` slot, if any, is held with the in-flight slot.
    pub(super) async fn send_script(
        &self,
        script: Script,
        deadline: tokio::time::Instant,
        sheddable: bool,
        refund: Option<Refund>,
        mut lane: Option<Slot>,
    ) -> Result<Value, NoReply> {
        let inner = &self.inner;
        let outage = |kind, m: &str| Err(NoReply::Outage(StoreError::new(kind, m)));
        let pass = inner.breaker.pass();
        if pass == Pass::Refuse {
            return outage(
                StoreErrorKind::Connection,
                "the circuit breaker is open (Redis failed repeatedly); probing again shortly",
            );
        }
        let probe = pass == Pass::Probe;
        let release = || {
            if probe {
                inner.breaker.release_probe();
            }
        };
        let Some(conn) = inner.conn.read().clone() else {
            release();
            return outage(
                StoreErrorKind::Connection,
                "not connected to Redis yet (connecting in the background)",
            );
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            release();
            return outage(
                StoreErrorKind::Other,
                "the Redis store needs a Tokio runtime",
            );
        };
        // A slot among the calls in flight, waiting at most until the deadline. No room in time:
        // overload if Redis is answering others, else an outage.
        // A check past its key's first two calls took its slot with its turn (`lanes.rs`).
        let waited_from = inner.clock();
        let taken = lane.as_mut().and_then(Slot::take_gate).ok_or(());
        let permit = match taken.or_else(|()| Arc::clone(&inner.gate).try_acquire_owned()) {
            Ok(p) => p,
            Err(_) => {
                let gate = Arc::clone(&inner.gate);
                match tokio::time::timeout_at(deadline, gate.acquire_owned()).await {
                    Ok(Ok(p)) => p,
                    _ => {
                        release();
                        if inner.replied_since(waited_from.saturating_sub(nanos(SILENCE))) {
                            if sheddable {
                                return Err(NoReply::Overload(Shed::NoRoom));
                            }
                            return Err(self.late(format!(
                                "no room among {} calls in flight within {:?} while Redis answered others",
                                inner.max_in_flight, inner.timeout
                            )));
                        }
                        return outage(
                            StoreErrorKind::Timeout,
                            &format!(
                                "{} calls in flight and no reply within {:?}",
                                inner.max_in_flight, inner.timeout
                            ),
                        );
                    }
                }
            }
        };
        let (tx, mut rx) = oneshot::channel();
        let queue = lane.as_ref().and_then(Slot::lane);
        let sent_at = inner.clock();
        // Set when this caller answers "shed" after giving up on the reply.
        let shed_flag = Arc::new(AtomicBool::new(false));
        let was_shed = Arc::clone(&shed_flag);
        let sender = self.clone();
        rt.spawn(async move {
            // Held through a refund too: everything sent to Redis counts against the gate.
            // The lane's slot is released after the store's (locals drop in reverse order), so
            // the key never has more calls in flight than its lane allows.
            let _lane = lane;
            let _slot = permit;
            let inner = &sender.inner;
            let call = |name: &str, body: &str| {
                let mut c = ::redis::cmd(name);
                c.arg(body)
                    .arg(script.keys.len())
                    .arg(&script.keys)
                    .arg(&script.args);
                c
            };
            let reply = match conn.query(&call("EVALSHA", &script.sha)).await {
                Err(e) if e.kind() == ErrorKind::NoScriptError => {
                    conn.query(&call("EVAL", &script.src)).await
                }
                r => r,
            };
            let answered = match &reply {
                Ok(_) => true,
                Err(e) => !matches!(
                    error_kind(e),
                    StoreErrorKind::Connection | StoreErrorKind::Timeout
                ),
            };
            if answered {
                inner.replied();
            } else if reply
                .as_ref()
                .is_err_and(|e| error_kind(e) == StoreErrorKind::Connection)
            {
                // Only a failed connection is "broken". A reply slower than the connection's own
                // timeout is not: under a flood that made Redis a second behind, it turned overload
                // into an outage, and fail-open let 23,456 requests past a limit of 1000 (moving
                // window, two `server` instances, scripts/redis_http_flood.sh). Silence (no reply
                // for 2 s) still makes a hung Redis an outage.
                inner.broken();
            }
            if let Err(unseen) = tx.send(reply) {
                inner.late_replies.add(1);
                if answered {
                    inner.breaker.success();
                }
                let back = match (unseen, refund) {
                    (Ok(v), Some(refund)) => refund(&v, was_shed.load(Ordering::Acquire)),
                    _ => None,
                };
                if let Some(args) = back {
                    let mut cmd = ::redis::cmd("EVALSHA");
                    cmd.arg(&script.sha)
                        .arg(script.keys.len())
                        .arg(&script.keys)
                        .arg(args);
                    // No caller waits for a refund: it gets the connection's own patience (at
                    // 50 ms, 255 of 304 refunds after a 400 ms `CLIENT PAUSE` were lost:
                    // `redis_many_keys`). The slot is held meanwhile, so refunds add no load past
                    // the gate.
                    let patience = inner.timeout.saturating_add(LATE_GRACE);
                    let sent = tokio::time::timeout(patience, conn.query(&cmd));
                    if matches!(sent.await, Ok(Ok(_))) {
                        inner.late_refunded.add(1);
                    }
                }
            }
        });
        let mut got = tokio::time::timeout_at(deadline, &mut rx).await;
        // A key with no check waiting behind this one is not flooding: while Redis answers (it
        // replied to something within the last 2 s), its reply is waited for a while longer
        // rather than shed, so another key's flood, which slows this process, does not reject it.
        if got.is_err()
            && sheddable
            && queue.as_ref().is_some_and(|l| l.unqueued())
            && inner.replied_since(sent_at.saturating_sub(nanos(SILENCE)))
        {
            inner.waited_longer.add(1);
            got = tokio::time::timeout_at(deadline + UNQUEUED_GRACE, &mut rx).await;
        }
        let reply = match got {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => {
                release();
                return outage(
                    StoreErrorKind::Other,
                    "the Redis call's task ended without a reply",
                );
            }
            Err(_) => {
                inner.timed_out.add(1);
                // This task itself woke a whole timeout late: the process is starved (the reply
                // reader with it), so Redis's silence proves nothing.
                let starved =
                    tokio::time::Instant::now().saturating_duration_since(deadline) > inner.timeout;
                if starved || inner.replied_since(sent_at.saturating_sub(nanos(SILENCE))) {
                    // Redis answered calls lately: overload (or this process is starved), not an
                    // outage. A check is never admitted, never a 5xx; a refund that times out
                    // must not open the breaker (under a flood with a concurrency cap, refunds of
                    // the requests over it did, and healthy Redis was failed open).
                    release();
                    if sheddable {
                        shed_flag.store(true, Ordering::Release);
                        return Err(NoReply::Overload(Shed::Slow));
                    }
                    return Err(self.late(format!(
                        "no reply within {:?} while Redis answered others",
                        inner.timeout
                    )));
                }
                self.probe_failed(probe);
                return outage(
                    StoreErrorKind::Timeout,
                    &format!("no reply within {:?}", inner.timeout),
                );
            }
        };
        match reply {
            Ok(v) => {
                inner.breaker.success();
                Ok(v)
            }
            Err(e) => {
                let e = map_error(e);
                // The connection's own timeout (ours plus `LATE_GRACE`) reached a caller still
                // waiting: this process was starved past the deadline. While Redis answers others
                // that is overload, as above (under a 2000-connection flood with a concurrency cap,
                // 160 checks were failed open this way).
                if e.kind() == StoreErrorKind::Timeout
                    && inner.replied_since(sent_at.saturating_sub(nanos(SILENCE)))
                {
                    inner.timed_out.add(1);
                    release();
                    if sheddable {
                        return Err(NoReply::Overload(Shed::Slow));
                    }
                    return Err(self.late(e.message().to_owned()));
                }
                if matches!(
                    e.kind(),
                    StoreErrorKind::Connection | StoreErrorKind::Timeout
                ) {
                    self.probe_failed(probe);
                } else {
                    inner.breaker.success();
                }
                Err(NoReply::Outage(e))
            }
        }
    }

    /// A call that is never shed timed out under overload ([`NoReply::Late`]): counted and warned.
    fn late(&self, message: String) -> NoReply {
        let e = StoreError::new(StoreErrorKind::Timeout, message);
        self.settle_timed_out(&e);
        NoReply::Late(e)
    }

    /// Counts a call made after its request was decided (a settlement, a reset, a peek, a lease
    /// release) that timed out, warning at most once a second.
    pub(super) fn settle_timed_out(&self, e: &StoreError) {
        let i = &self.inner;
        i.settle_timed_out.add(1);
        if i.last_settle_warn.ready(WARN_EVERY) {
            tracing::warn!(
                error = %e,
                settle_timed_out = i.settle_timed_out.get(),
                timeout = ?i.timeout,
                "rate-limit Redis store: a settlement or lease release timed out after its request \
                 was decided (nothing let through, not an outage): a refund Redis does not apply \
                 leaves its estimate charged, a lease not released expires by its TTL; raise the store \
                 timeout if this keeps growing while Redis is healthy (logged at most once per \
                 second)"
            );
        }
    }

    /// A call failed on the connection: the breaker counts it, and a failed probe of the open
    /// circuit rebuilds a Cluster connection.
    fn probe_failed(&self, probe: bool) {
        self.inner.breaker.failure(probe);
        if probe {
            rebuild::after_failed_probe(&self.inner);
        }
    }
}
