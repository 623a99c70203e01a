//! Connecting (single node, Cluster, Sentinel), the credential check, and reconnecting in the
//! background.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Cmd, RedisError, Value};

use super::errors::map_error;
use super::target::{Target, TargetKind};
use super::tls::certs;
use super::{Inner, LATE_GRACE, RECONNECT_ATTEMPT, RECONNECT_PAUSE, RedisStore, resolve, sentinel};
use crate::error::{StoreError, StoreErrorKind};

#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<sentinel::SentinelConn>),
}

impl Conn {
    pub(super) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Sentinel(c) => c.query(cmd).await,
        }
    }
}

pub(super) async fn connect(
    target: &Target,
    timeout: Duration,
    connect_timeout: Duration,
) -> Result<Conn, StoreError> {
    let shown = target.shown.as_str();
    let tls = &target.tls;
    match &target.kind {
        TargetKind::Sentinel(sentinels) => {
            let certs = (!tls.is_empty()).then(|| tls.certificates());
            let c = sentinel::SentinelConn::connect(
                sentinels,
                certs,
                manager_config(timeout, connect_timeout),
                connect_timeout,
            )
            .await
            .map_err(|e| map_error(e).in_context(shown))?;
            Ok(Conn::Sentinel(c))
        }
        TargetKind::Cluster(client, seeds) => {
            // The first seed that answers tells a refused password (the Cluster client would
            // retry it until the connect timeout); seeds that do not answer are skipped.
            for seed in seeds {
                match check_credentials(seed, certs(tls), shown, connect_timeout).await {
                    Ok(()) => break,
                    Err(e)
                        if matches!(
                            e.kind(),
                            StoreErrorKind::Connection | StoreErrorKind::Timeout
                        ) => {}
                    Err(e) => return Err(e),
                }
            }
            let c = tokio::time::timeout(connect_timeout, client.get_async_connection())
                .await
                .map_err(|_| {
                    StoreError::new(
                        StoreErrorKind::Connection,
                        format!("{shown}: no Cluster node answered within {connect_timeout:?}"),
                    )
                })?
                .map_err(map_error)?;
            Ok(Conn::Cluster(c))
        }
        TargetKind::Single(client) => {
            check_credentials(client, certs(tls), shown, connect_timeout).await?;
            let config = manager_config(timeout, connect_timeout);
            let c = tokio::time::timeout(
                connect_timeout,
                ConnectionManager::new_with_config(client.clone(), config),
            )
            .await
            .map_err(|_| {
                StoreError::new(
                    StoreErrorKind::Connection,
                    format!(
                        "{shown}: no answer (or authentication refused) within {connect_timeout:?}"
                    ),
                )
            })?
            .map_err(map_error)?;
            Ok(Conn::Single(c))
        }
    }
}

/// The connection manager's settings: a reply may take the timeout plus [`LATE_GRACE`] before the
/// manager gives up on it (the caller gives up at the timeout); reconnects back off up to 200 ms.
pub(super) fn manager_config(
    timeout: Duration,
    connect_timeout: Duration,
) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(connect_timeout)
        .set_response_timeout(timeout.saturating_add(LATE_GRACE))
        .set_factor(2)
        .set_max_delay(200)
        .set_number_of_retries(8)
}

/// Connects once without credentials and sends `AUTH` itself, so that a refusal reports the
/// server's own words (`WRONGPASS invalid username-password pair ...`): the `redis` crate replaces
/// them with its own message, and its connection manager retries until the connect timeout, which
/// made a wrong password look like a timeout. Unreachable servers give a connection error.
pub(super) async fn check_credentials(
    client: &::redis::Client,
    certs: Option<::redis::TlsCertificates>,
    shown: &str,
    within: Duration,
) -> Result<(), StoreError> {
    match tokio::time::timeout(within, authenticate(client, certs)).await {
        Err(_) => Err(StoreError::new(
            StoreErrorKind::Connection,
            format!("{shown}: no answer within {within:?}"),
        )),
        Ok(Err(e)) => {
            let err = map_error(e);
            Err(if err.kind() == StoreErrorKind::Server {
                err.in_context(&format!("{shown}: Redis refused the connection"))
            } else {
                err
            })
        }
        Ok(Ok(())) => Ok(()),
    }
}

/// Connects to `client`'s server without its credentials, then sends `AUTH` and `PING`: a refusal
/// is the server's own reply (`WRONGPASS ...`), not the `redis` crate's rewording of it.
pub(super) async fn authenticate(
    client: &::redis::Client,
    certs: Option<::redis::TlsCertificates>,
) -> Result<(), RedisError> {
    let mut info = client.get_connection_info().clone();
    let password = info.redis.password.take();
    let username = info.redis.username.take();
    let bare = match certs {
        None => ::redis::Client::open(info)?,
        Some(c) => ::redis::Client::build_with_tls(info, c)?,
    };
    let mut c = bare.get_multiplexed_async_connection().await?;
    if let Some(password) = password {
        let mut auth = ::redis::cmd("AUTH");
        if let Some(user) = username {
            auth.arg(user);
        }
        auth.arg(password);
        auth.query_async::<()>(&mut c).await?;
    }
    ::redis::cmd("PING").query_async::<()>(&mut c).await
}

/// Whether a connection error means "nobody answered" (start anyway and keep trying) rather than
/// "Redis answered and refused" (authentication, TLS, a bad URL: fail at start).
pub(super) fn unreachable(e: &StoreError) -> bool {
    match e.kind() {
        StoreErrorKind::Timeout => true,
        StoreErrorKind::Connection => {
            let m = e.to_string().to_ascii_lowercase();
            !(m.contains("certificate") || m.contains("tls") || m.contains("handshake"))
        }
        _ => false,
    }
}

/// A host name of the store's URL does not resolve: an error, not the warning of a Redis that is
/// still booting (a typo in a name never heals by itself).
pub(super) fn report_unresolved(target: &Target, missing: &[String]) {
    tracing::error!(
        url = %target.shown,
        hosts = ?missing,
        "Redis host name {} does not resolve (DNS); the store has no connection and decides by \
         the failure policy; retrying in the background, reported every {}s while it lasts",
        missing.join(", "),
        resolve::REPORT_EVERY.as_secs()
    );
}

/// Tries to connect every [`RECONNECT_PAUSE`] until it succeeds or the store is dropped; while a
/// host name does not resolve (`unresolved` at start-up), says so every
/// [`resolve::REPORT_EVERY`] instead of warning about each attempt.
pub(super) fn reconnect_in_background(
    inner: Weak<Inner>,
    target: Target,
    connect_timeout: Duration,
    mut unresolved: bool,
) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let within = connect_timeout.min(RECONNECT_ATTEMPT);
        let mut resolved_at = Instant::now();
        loop {
            tokio::time::sleep(RECONNECT_PAUSE).await;
            let Some(timeout) = inner.upgrade().map(|i| i.timeout) else {
                return;
            };
            match connect(&target, timeout, within).await {
                Ok(conn) => {
                    let Some(strong) = inner.upgrade() else {
                        return;
                    };
                    *strong.conn.write() = Some(conn);
                    let store = RedisStore::of(strong);
                    if let Err(e) = store.prepare(within).await {
                        // EVALSHA falls back to EVAL on NOSCRIPT: decisions work regardless.
                        tracing::debug!(error = %e, "loading the scripts after reconnecting");
                    }
                    tracing::info!("connected to Redis; limiting resumes");
                    return;
                }
                Err(e) => {
                    if resolved_at.elapsed() >= resolve::REPORT_EVERY {
                        resolved_at = Instant::now();
                        let missing = resolve::unresolved(&target.hosts, within).await;
                        unresolved = !missing.is_empty();
                        if unresolved {
                            report_unresolved(&target, &missing);
                        }
                    }
                    if unresolved {
                        continue;
                    }
                    if let Some(strong) = inner.upgrade() {
                        RedisStore::of(strong).warn(&e);
                    }
                }
            }
        }
    });
}
