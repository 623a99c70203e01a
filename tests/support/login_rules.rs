//! A login route's rules (per IP, per username, one global limit) and its requests, shared by the
//! multi-limit tests of the memory store and of Redis.
#![allow(dead_code, unreachable_pub)]

use http::Request;

/// Three limits on `/login`: `x-ip` by a fixed window, `x-user` by `user_strategy`, and one global
/// token bucket, each `N/hour`.
pub fn login_limits(ip: u32, user_strategy: &str, user: u32, global: u32) -> String {
    format!(
        r#"
        [[limit]]
        name = "per-ip"
        key = "header:x-ip"
        strategy = "fixed-window"
        quotas = "{ip}/hour"

        [[limit]]
        name = "per-user"
        key = "header:x-user"
        strategy = "{user_strategy}"
        quotas = "{user}/hour"

        [[limit]]
        name = "global"
        key = "global"
        strategy = "token-bucket"
        quotas = "{global}/hour"
        "#
    )
}

/// A login from client `ip` (10.0.0.ip) as `user` (userN).
pub fn login_request(ip: usize, user: usize) -> Request<()> {
    Request::builder()
        .uri("/login")
        .header("x-ip", format!("10.0.0.{ip}"))
        .header("x-user", format!("user{user}"))
        .body(())
        .expect("a valid request")
}
