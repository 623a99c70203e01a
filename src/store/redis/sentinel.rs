//! Redis Sentinel: `redis+sentinel://[user:pass@]H1:P1[,H2:P2]/SERVICE[/DB]` and
//! `rediss+sentinel://...` (TLS to the sentinels and the primary). The sentinels name the current
//! primary; the store talks to it through a connection manager, and asks the sentinels again
//! whenever the connection fails or the server answers `READONLY` (a demoted primary), and every
//! [`WATCH_EVERY`] (the address the sentinels name, compared with the current one), so a failover is
//! followed without a restart, also when the old primary stays up and keeps accepting writes.
//!
//! Why the watch: after a failover of a live primary (`SENTINEL FAILOVER`, a partition), the
//! sentinels reconfigure the old primary as a replica only after their next `INFO` of it (up to
//! 10 s later). Until then it answers writes, which are lost when it resyncs: the first version of
//! this store, relying on errors alone, kept deciding there for 13.6 s after a `SENTINEL FAILOVER`
//! and lost 276 admissions (`redis_sentinel::rediss_sentinel_follows_a_failover_with_tls_everywhere`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::UrlProblem;
use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use ::redis::{Cmd, ConnectionAddr, ErrorKind, RedisError, TlsMode, Value};
use parking_lot::RwLock;

/// The least time between two questions to the sentinels.
const RESOLVE_PAUSE: Duration = Duration::from_millis(100);
/// How often the store asks a sentinel which primary it names, to leave a demoted primary that
/// still answers. The writes a live old primary takes in this time after a failover are lost.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// A parsed Sentinel URL.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Target {
    pub(super) secure: bool,
    pub(super) sentinels: Vec<(String, u16)>,
    pub(super) service: String,
    pub(super) db: i64,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
}

/// Parses `redis+sentinel://` and `rediss+sentinel://` URLs; `None` for other schemes.
pub(super) fn parse(url: &str) -> Option<Result<Target, UrlProblem>> {
    let lower = url.to_ascii_lowercase();
    let (secure, rest) = if lower.starts_with("redis+sentinel://") {
        (false, url.get("redis+sentinel://".len()..)?)
    } else if lower.starts_with("rediss+sentinel://") {
        (true, url.get("rediss+sentinel://".len()..)?)
    } else {
        return None;
    };
    Some(parse_rest(secure, rest))
}

fn parse_rest(secure: bool, rest: &str) -> Result<Target, UrlProblem> {
    let (authority, path) = rest.split_once('/').ok_or(UrlProblem::SentinelPath)?;
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (username, password) = match userinfo {
        None => (None, None),
        Some(u) => match u.split_once(':') {
            Some((user, pass)) => (
                (!user.is_empty()).then(|| user.to_owned()),
                Some(pass.to_owned()),
            ),
            None => (None, Some(u.to_owned())),
        },
    };
    let mut sentinels = Vec::new();
    for h in hosts.split(',').map(str::trim).filter(|h| !h.is_empty()) {
        let (host, port) = h
            .rsplit_once(':')
            .ok_or_else(|| UrlProblem::SentinelAddress(h.to_owned()))?;
        let port: u16 = port
            .parse()
            .map_err(|_| UrlProblem::SentinelAddress(h.to_owned()))?;
        sentinels.push((host.trim_matches(['[', ']']).to_owned(), port));
    }
    if sentinels.is_empty() {
        return Err(UrlProblem::NoSentinel);
    }
    let mut parts = path.split('/');
    let service = parts.next().unwrap_or_default();
    if service.is_empty() {
        return Err(UrlProblem::SentinelPath);
    }
    let db = match parts.next() {
        None | Some("") => 0,
        Some(d) => d.parse().map_err(|_| UrlProblem::Database(d.to_owned()))?,
    };
    if parts.next().is_some() {
        return Err(UrlProblem::SentinelPath);
    }
    Ok(Target {
        secure,
        sentinels,
        service: service.to_owned(),
        db,
        username,
        password,
    })
}

/// The primary named by the sentinels, followed across failovers.
pub(super) struct SentinelConn {
    client: tokio::sync::Mutex<SentinelClient>,
    current: RwLock<Option<ConnectionManager>>,
    /// The address of `current`'s primary, as the sentinels named it.
    current_addr: RwLock<Option<(String, u16)>>,
    service: String,
    /// The TLS files for the primary, for the credential check.
    certs: Option<::redis::TlsCertificates>,
    /// What the URL gives to log in to the primary, for the credential check.
    secure: bool,
    login: ::redis::RedisConnectionInfo,
    config: ConnectionManagerConfig,
    resolving: AtomicBool,
    within: Duration,
}

impl SentinelConn {
    /// Asks the sentinels for the primary and connects to it.
    pub(super) async fn connect(
        target: &Target,
        certs: Option<::redis::TlsCertificates>,
        config: ConnectionManagerConfig,
        within: Duration,
    ) -> Result<Arc<Self>, RedisError> {
        let addrs = target.sentinels.iter().map(|(h, p)| {
            if target.secure {
                ConnectionAddr::TcpTls {
                    host: h.clone(),
                    port: *p,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(h.clone(), *p)
            }
        });
        let mut b =
            SentinelClientBuilder::new(addrs, target.service.clone(), SentinelServerType::Master)?
                .set_client_to_redis_db(target.db);
        if let Some(u) = &target.username {
            b = b.set_client_to_redis_username(u.clone());
        }
        if let Some(p) = &target.password {
            b = b.set_client_to_redis_password(p.clone());
        }
        if target.secure {
            b = b
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            if let Some(c) = certs.clone() {
                b = b
                    .set_client_to_redis_certificates(c.clone())
                    .set_client_to_sentinel_certificates(c);
            }
        }
        let conn = Arc::new(Self {
            client: tokio::sync::Mutex::new(b.build()?),
            current: RwLock::new(None),
            current_addr: RwLock::new(None),
            service: target.service.clone(),
            certs,
            secure: target.secure,
            login: ::redis::RedisConnectionInfo {
                db: target.db,
                username: target.username.clone(),
                password: target.password.clone(),
                ..Default::default()
            },
            config,
            resolving: AtomicBool::new(false),
            within,
        });
        conn.resolve().await?;
        watch(Arc::downgrade(&conn));
        Ok(conn)
    }

    async fn resolve(&self) -> Result<(), RedisError> {
        let work = async {
            // The lock is released before `refusal` takes it again.
            let asked = self.client.lock().await.async_get_client().await;
            let client = match asked {
                Ok(c) => c,
                Err(e) if e.kind() == ErrorKind::AuthenticationFailed => {
                    return Err(self.refusal().await.unwrap_or(e));
                }
                Err(e) => return Err(e),
            };
            let addr = host_port(&client.get_connection_info().addr);
            let manager = ConnectionManager::new_with_config(client, self.config.clone()).await?;
            Ok::<_, RedisError>((manager, addr))
        };
        let (manager, addr) = tokio::time::timeout(self.within, work)
            .await
            .map_err(|_| {
                RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no primary from the sentinels in time",
                ))
            })??;
        *self.current.write() = Some(manager);
        *self.current_addr.write() = addr;
        Ok(())
    }

    /// The primary's own words for a refused login (`WRONGPASS ...`; the `redis` crate's sentinel
    /// client rewords them), from logging in to the primary a sentinel names.
    async fn refusal(&self) -> Option<RedisError> {
        let sentinel = self
            .client
            .lock()
            .await
            .async_get_sentinel_client()
            .await
            .ok()?;
        let mut c = sentinel.get_multiplexed_async_connection().await.ok()?;
        let (host, port) = self.named(&mut c).await.ok()??;
        let addr = if self.secure {
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host, port)
        };
        let info = ::redis::ConnectionInfo {
            addr,
            redis: self.login.clone(),
        };
        let client = match self.certs.clone() {
            None => ::redis::Client::open(info),
            Some(c) => ::redis::Client::build_with_tls(info, c),
        }
        .ok()?;
        super::authenticate(&client, self.certs.clone()).await.err()
    }

    /// The primary a sentinel names now, over `conn` (a connection to one sentinel).
    async fn named(
        &self,
        conn: &mut ::redis::aio::MultiplexedConnection,
    ) -> Result<Option<(String, u16)>, RedisError> {
        let mut cmd = ::redis::cmd("SENTINEL");
        cmd.arg("get-master-addr-by-name").arg(&self.service);
        let named: Option<(String, u16)> = tokio::time::timeout(self.within, cmd.query_async(conn))
            .await
            .map_err(|_| {
                RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer from the sentinel in time",
                ))
            })??;
        Ok(named)
    }

    /// Asks the sentinels again in the background (one question at a time).
    fn resolve_soon(self: &Arc<Self>) {
        if self.resolving.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.resolving.store(false, Ordering::Release);
            return;
        };
        let me = Arc::clone(self);
        rt.spawn(async move {
            tokio::time::sleep(RESOLVE_PAUSE).await;
            if let Err(e) = me.resolve().await {
                tracing::debug!(error = %e, "asking the sentinels for the primary");
            }
            me.resolving.store(false, Ordering::Release);
        });
    }

    pub(super) async fn query(self: &Arc<Self>, cmd: &Cmd) -> Result<Value, RedisError> {
        let Some(mut c) = self.current.read().clone() else {
            self.resolve_soon();
            return Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "no primary known yet (asking the sentinels)",
            )));
        };
        let r = cmd.query_async(&mut c).await;
        if let Err(e) = &r {
            if e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.is_timeout()
                || matches!(e.kind(), ErrorKind::ReadOnly | ErrorKind::MasterDown)
            {
                self.resolve_soon();
            }
        }
        r
    }
}

/// `(host, port)` of a TCP address.
fn host_port(addr: &ConnectionAddr) -> Option<(String, u16)> {
    match addr {
        ConnectionAddr::Tcp(h, p)
        | ConnectionAddr::TcpTls {
            host: h, port: p, ..
        } => Some((h.clone(), *p)),
        _ => None,
    }
}

/// Every [`WATCH_EVERY`], asks a sentinel which primary it names, and switches when that is not the
/// current one. Ends when the store is dropped.
fn watch(conn: std::sync::Weak<SentinelConn>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let mut sentinel: Option<::redis::aio::MultiplexedConnection> = None;
        loop {
            tokio::time::sleep(WATCH_EVERY).await;
            let Some(me) = conn.upgrade() else {
                return;
            };
            if sentinel.is_none() {
                let opened = async {
                    let client = me.client.lock().await.async_get_sentinel_client().await?;
                    client.get_multiplexed_async_connection().await
                };
                sentinel = tokio::time::timeout(me.within, opened)
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
            let Some(c) = sentinel.as_mut() else {
                continue;
            };
            match me.named(c).await {
                Ok(Some(named)) => {
                    if me.current_addr.read().as_ref() != Some(&named) {
                        tracing::info!(
                            primary = %format!("{}:{}", named.0, named.1),
                            "the sentinels name another primary; switching to it"
                        );
                        if let Err(e) = me.resolve().await {
                            tracing::debug!(error = %e, "asking the sentinels for the primary");
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "watching the sentinel");
                    sentinel = None;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_url_forms_parse() {
        let t = parse("redis+sentinel://u:p@10.0.0.1:26379,10.0.0.2:26380/mymaster/2")
            .unwrap()
            .unwrap();
        assert_eq!(
            t,
            Target {
                secure: false,
                sentinels: vec![("10.0.0.1".into(), 26379), ("10.0.0.2".into(), 26380)],
                service: "mymaster".into(),
                db: 2,
                username: Some("u".into()),
                password: Some("p".into()),
            }
        );
        let t = parse("rediss+sentinel://:secret@h:1/svc").unwrap().unwrap();
        assert!(t.secure);
        assert_eq!(
            (t.username, t.password, t.db),
            (None, Some("secret".into()), 0)
        );
        assert!(parse("redis://h:1").is_none());
        for bad in [
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel:///svc",
            "redis+sentinel://h/svc",
            "redis+sentinel://h:1/svc/x",
            "redis+sentinel://h:1/svc/1/2",
        ] {
            assert!(parse(bad).unwrap().is_err(), "{bad}");
        }
    }
}
