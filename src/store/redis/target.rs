//! The URL forms the store accepts, checked at build time, and passwords masked in messages.

use std::sync::Arc;
use std::time::Duration;

use ::redis::cluster::ClusterClient;

use super::tls::{TlsFiles, client_for};
use super::{LATE_GRACE, resolve, sentinel};
use crate::error::{ConfigError, UrlProblem};

/// `url` with any password replaced by `***`, for error messages and logs: a connection URL may
/// carry credentials (`redis://:secret@host`, `redis://user:secret@host`), which must never reach a
/// log line.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = url.get(scheme_end..).unwrap_or_default();
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = rest.get(..authority_end).unwrap_or_default();
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = authority.get(..at).unwrap_or_default();
            let user = userinfo.split_once(':').map_or("", |(u, _)| u);
            format!(
                "{}{user}:***@{}",
                url.get(..scheme_end).unwrap_or_default(),
                rest.get(at + 1..).unwrap_or_default()
            )
        }
        None => url.to_owned(),
    }
}

/// Where the store connects, checked when the store is built: every mistake in the URL or the TLS
/// options is found there, before any connection, and the background reconnects reuse it.
#[derive(Clone)]
pub(super) struct Target {
    /// The URL with its password masked, for messages.
    pub(super) shown: String,
    /// The hosts the URL names, for telling a name that does not resolve from a silent server.
    pub(super) hosts: Vec<(String, u16)>,
    pub(super) tls: TlsFiles,
    pub(super) kind: TargetKind,
}

#[derive(Clone)]
pub(super) enum TargetKind {
    Single(::redis::Client),
    /// The Cluster client, and a client per seed node for the credential check.
    Cluster(ClusterClient, Vec<::redis::Client>),
    Sentinel(Arc<sentinel::Target>),
}

impl Target {
    pub(super) fn parse(
        url: &str,
        tls: TlsFiles,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let shown = redact(url);
        let bad = |problem: UrlProblem| ConfigError::RedisUrl {
            url: shown.clone(),
            problem,
        };
        let refused = |e: ::redis::RedisError| bad(UrlProblem::Refused(Arc::new(e)));
        let lower = url.to_ascii_lowercase();
        let secure = lower.starts_with("rediss");
        if !tls.is_empty() && !secure {
            return Err(bad(UrlProblem::NotTls));
        }
        let cluster = ["redis+cluster://", "rediss+cluster://"]
            .into_iter()
            .find(|p| lower.starts_with(p));
        let kind = if let Some(target) = sentinel::parse(url) {
            TargetKind::Sentinel(Arc::new(target.map_err(bad)?))
        } else if let Some(rest) = cluster.map(|p| url.get(p.len()..).unwrap_or_default()) {
            let scheme = if secure { "rediss" } else { "redis" };
            let (auth, hosts) = match rest.rsplit_once('@') {
                Some((a, h)) => (format!("{a}@"), h),
                None => (String::new(), rest),
            };
            let nodes: Vec<String> = hosts
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(|h| format!("{scheme}://{auth}{h}"))
                .collect();
            if nodes.is_empty() {
                return Err(bad(UrlProblem::NoClusterNode));
            }
            let mut builder = ClusterClient::builder(nodes.clone());
            if !tls.is_empty() {
                builder = builder.certs(tls.certificates());
            }
            let client = builder
                .retries(3)
                .min_retry_wait(5)
                .max_retry_wait(100)
                .connection_timeout(connect_timeout)
                .response_timeout(timeout.saturating_add(LATE_GRACE))
                .build()
                .map_err(refused)?;
            let seeds = nodes
                .iter()
                .map(|n| client_for(n, &tls).map_err(refused))
                .collect::<Result<_, _>>()?;
            TargetKind::Cluster(client, seeds)
        } else if ["redis://", "rediss://", "redis+unix://"]
            .iter()
            .any(|p| lower.starts_with(p))
        {
            TargetKind::Single(client_for(url, &tls).map_err(refused)?)
        } else {
            return Err(bad(UrlProblem::Scheme));
        };
        Ok(Self {
            shown,
            hosts: resolve::hosts(url),
            tls,
            kind,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bug (found by `redis_faults::wrong_password_is_a_store_error_and_fail_closed_never_admits`):
    /// connection errors quoted the URL verbatim, password included, into messages that are logged.
    #[test]
    fn connection_urls_are_redacted_in_messages() {
        assert_eq!(
            redact("redis://127.0.0.1:6379/0"),
            "redis://127.0.0.1:6379/0"
        );
        assert_eq!(redact("redis://:s3cret@h:1"), "redis://:***@h:1");
        assert_eq!(
            redact("redis://user:s3cret@h:1/2"),
            "redis://user:***@h:1/2"
        );
        assert_eq!(redact("redis://user@h:1"), "redis://:***@h:1");
        assert_eq!(
            redact("redis+cluster://:p@ss@a:1,b:2"),
            "redis+cluster://:***@a:1,b:2"
        );
        assert_eq!(redact("not a url"), "not a url");
    }
}
