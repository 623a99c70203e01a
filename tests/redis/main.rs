//! Redis tests (feature `redis`): the store against real `redis-server` processes started per test on
//! free ports, Cluster (with a failover under a flood), faults (kill, hang, pause, flush, OOM), a flood
//! on one key and on many keys, degraded mode and the circuit breaker, settlements that time out and
//! a starved process, TLS (one node and a Cluster), leasing (one node and a Cluster), Sentinel with
//! failovers (plain and TLS), and the `server` example on Redis.

#[path = "../support/examples.rs"]
mod examples;
#[path = "../support/login_rules.rs"]
mod login_rules;
#[path = "../support/logs.rs"]
mod logs;
#[path = "../support/redis.rs"]
mod redis_support;
#[path = "../support/http.rs"]
mod support;

mod leases;
mod leases_cluster;
mod limiter_names;
mod redis_cluster;
mod redis_cluster_failover;
mod redis_concurrency_limit;
mod redis_degraded;
mod redis_errors;
mod redis_fair_shedding;
mod redis_faults;
mod redis_faults_flood;
mod redis_flood;
mod redis_many_keys;
mod redis_sentinel;
mod redis_server;
mod redis_settle_from_response;
mod redis_settle_timeout;
mod redis_starved;
mod redis_store;
mod redis_tls;
mod redis_tls_cluster;
mod redis_wrong_password;
mod rolling_deploy;
mod rules_fail_mode;
mod rules_redis;
mod rules_redis_many;
mod rules_server_redis;
mod shaping_queue;
mod state_identity;
mod window_offset;
