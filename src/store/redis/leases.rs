//! Leases of the per-key concurrency limit ([`ConcurrencyLimit::redis`](crate::layer::ConcurrencyLimit::redis)):
//! one sorted set per key and limiter name, members the leases in flight, scores their expiry in
//! Redis server milliseconds. Acquiring drops expired leases and adds one if fewer than the cap
//! are held (one script call); a lease is renewed while its request is in flight and removed when
//! it ends (`ZREM`); its expiry is the backstop for a process that died holding it.

use std::time::Duration;

use ::redis::{Script, Value};

use super::{Conn, RedisStore, keys, map_error};
use crate::error::{StoreError, StoreErrorKind};
use crate::store::StoreKey;

const ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[1]) then
  return {0, n}
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
return {1, n + 1}
";

const RENEW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
";

/// `EVALSHA`, and `EVAL` with the source when the server does not know the script (`NOSCRIPT`:
/// a flushed or restarted server, a fresh Cluster node).
async fn run_script(
    conn: &Conn,
    (script, source): (&Script, &str),
    key: &str,
    args: &[&str],
) -> Result<Value, ::redis::RedisError> {
    let call = |verb: &str, body: &str| {
        let mut cmd = ::redis::cmd(verb);
        cmd.arg(body).arg(1).arg(key);
        for a in args {
            cmd.arg(*a);
        }
        cmd
    };
    match conn.query(&call("EVALSHA", script.get_hash())).await {
        Err(e) if e.kind() == ::redis::ErrorKind::NoScriptError => {
            conn.query(&call("EVAL", source)).await
        }
        other => other,
    }
}

fn scripts() -> &'static (Script, Script) {
    static SCRIPTS: std::sync::OnceLock<(Script, Script)> = std::sync::OnceLock::new();
    SCRIPTS.get_or_init(|| (Script::new(ACQUIRE), Script::new(RENEW)))
}

impl RedisStore {
    /// The sorted set of `key`'s leases under the concurrency limit `name`.
    pub(crate) fn lease_key<K: StoreKey>(&self, key: &K, name: &str) -> String {
        let mut s = keys::tagged_key(&self.inner.prefix, key);
        s.push_str("c:");
        s.push_str(name);
        s
    }

    /// The connection, or an error while the store is still connecting.
    fn lease_conn(&self) -> Result<Conn, StoreError> {
        self.inner.conn.read().clone().ok_or_else(|| {
            StoreError::new(StoreErrorKind::Connection, "Redis is not connected yet")
        })
    }

    async fn timed<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, ::redis::RedisError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.inner.timeout, work).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(map_error(&e)),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Timeout,
                "a concurrency lease call timed out",
            )),
        }
    }

    /// Takes a lease `id` on `set` if fewer than `cap` are held: `(taken, held)` after the call.
    pub(crate) async fn lease_acquire(
        &self,
        set: &str,
        id: &str,
        cap: u32,
        ttl: Duration,
    ) -> Result<(bool, u64), StoreError> {
        let cap = cap.to_string();
        let ttl = ttl_ms(ttl).to_string();
        let conn = self.lease_conn()?;
        let v = self
            .timed(run_script(
                &conn,
                (&scripts().0, ACQUIRE),
                set,
                &[&cap, &ttl, id],
            ))
            .await?;
        match v {
            Value::Array(items) => match items.as_slice() {
                [Value::Int(taken), Value::Int(held)] => {
                    Ok((*taken == 1, u64::try_from(*held).unwrap_or(0)))
                }
                _ => Err(unexpected()),
            },
            _ => Err(unexpected()),
        }
    }

    /// Extends lease `id` on `set` to `ttl` from now; `false` when it had expired.
    pub(crate) async fn lease_renew(
        &self,
        set: &str,
        id: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let ttl = ttl_ms(ttl).to_string();
        let conn = self.lease_conn()?;
        let v = self
            .timed(run_script(&conn, (&scripts().1, RENEW), set, &[&ttl, id]))
            .await?;
        Ok(matches!(v, Value::Int(1)))
    }

    /// Gives lease `id` on `set` back. A release that times out is counted in
    /// `settle_timed_out` (and warned about at most once a second) here.
    pub(crate) async fn lease_release(&self, set: &str, id: &str) -> Result<(), StoreError> {
        let mut cmd = ::redis::cmd("ZREM");
        cmd.arg(set).arg(id);
        let conn = self.lease_conn()?;
        let released = self.timed(conn.query(&cmd)).await.map(drop);
        if let Err(e) = &released {
            if e.kind() == StoreErrorKind::Timeout {
                self.settle_timed_out(e);
            }
        }
        released
    }
}

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn unexpected() -> StoreError {
    StoreError::new(
        StoreErrorKind::Other,
        "unexpected reply to a concurrency lease script",
    )
}
