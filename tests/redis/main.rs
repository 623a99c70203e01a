//! Redis tests (feature `redis`): the store against real `redis-server` processes started per test on
//! free ports, Cluster, faults (kill, hang, pause, flush, OOM), and the `server` example on Redis.

#[path = "../support/redis.rs"]
mod redis_support;
#[path = "../support/http.rs"]
mod support;

mod limiter_names;
mod redis_cluster;
mod redis_faults;
mod redis_server;
mod redis_store;
mod rules_redis;
