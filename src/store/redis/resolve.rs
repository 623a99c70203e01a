//! Host names that do not resolve, told apart from a Redis that does not answer yet.
//!
//! Both start the store without a connection (a pod name may not be in DNS yet), but a name that
//! does not resolve is most often a typo that never heals: it is logged at error level, at start-up
//! and every [`REPORT_EVERY`] while it lasts, and `tollgate_store_up` stays 0.

use std::time::Duration;

/// How often a name that still does not resolve is reported again.
pub(super) const REPORT_EVERY: Duration = Duration::from_secs(10);

/// The `host:port` pairs a connection URL names (every node of a Cluster, every Sentinel), without
/// credentials; none for a Unix socket.
pub(super) fn hosts(url: &str) -> Vec<(String, u16)> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Vec::new();
    };
    if scheme.to_ascii_lowercase().contains("unix") {
        return Vec::new();
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    hosts
        .split(',')
        .filter_map(|h| {
            let h = h.trim();
            let (host, port) = match h.rsplit_once(':') {
                Some((host, port)) if !port.contains(']') => (host, port.parse().ok()?),
                _ => (h, 6379),
            };
            let host = host.trim_start_matches('[').trim_end_matches(']');
            (!host.is_empty()).then(|| (host.to_owned(), port))
        })
        .collect()
}

/// The host names of `hosts` that do not resolve (IP addresses always do). A lookup still
/// unanswered after `within` is not counted: a slow resolver is not a missing name.
pub(super) async fn unresolved(hosts: &[(String, u16)], within: Duration) -> Vec<String> {
    let mut missing = Vec::new();
    for (host, port) in hosts {
        if host.parse::<std::net::IpAddr>().is_ok() {
            continue;
        }
        let lookup = tokio::net::lookup_host((host.as_str(), *port));
        if let Ok(Err(_)) = tokio::time::timeout(within, lookup).await {
            missing.push(host.clone());
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_every_url_form_without_credentials() {
        let h = |u| hosts(u);
        assert_eq!(h("redis://127.0.0.1:7000/0"), [("127.0.0.1".into(), 7000)]);
        assert_eq!(
            h("rediss://:pw@cache.internal"),
            [("cache.internal".into(), 6379)]
        );
        assert_eq!(
            h("redis+cluster://u:p@a:1,b:2"),
            [("a".into(), 1), ("b".into(), 2)]
        );
        assert_eq!(
            h("redis+sentinel://s1:26379,[::1]:26380/mymaster/2"),
            [("s1".into(), 26379), ("::1".into(), 26380)]
        );
        assert!(h("redis+unix:///run/redis.sock").is_empty());
    }

    #[tokio::test]
    async fn a_name_under_the_invalid_domain_does_not_resolve_and_an_address_does() {
        let hosts = [
            ("no-such-host.invalid".to_owned(), 6379),
            ("127.0.0.1".to_owned(), 6379),
        ];
        assert_eq!(
            unresolved(&hosts, Duration::from_secs(5)).await,
            ["no-such-host.invalid"]
        );
    }
}
