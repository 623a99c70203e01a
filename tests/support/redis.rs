//! Test harness: starts `redis-server` on free loopback ports (a single node or a 3-master Cluster),
//! and stops, kills, pauses and restarts it. Never touches a server it did not start.
//!
//! When `redis-server` is missing, tests skip with a message, except under `CI=true`, where they fail.
#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `redis-server` can run here. Panics under `CI=true` when it cannot.
pub fn available() -> bool {
    let ok = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("redis-server is not installed, and CI=true: Redis tests must run in CI");
        }
        eprintln!("redis-server is not installed: skipping this Redis test (set CI=true to fail)");
    }
    ok
}

/// A free loopback port whose cluster bus port (+10000) is free too.
pub fn free_port() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().expect("local addr").port();
        if port < 55000 && port != 6379 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

/// Sends one inline command and reads the first reply line (enough for PING and state checks).
fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().expect("addr"),
        Duration::from_millis(200),
    ) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// One `redis-server` process.
pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free port; `None` (after a message) when Redis is not installed.
    pub fn start() -> Option<Self> {
        Self::start_with(&[])
    }

    /// Starts a server with extra `--option value` arguments.
    pub fn start_with(extra: &[&str]) -> Option<Self> {
        if !available() {
            return None;
        }
        let port = free_port();
        Some(Self::start_on(port, extra))
    }

    /// Starts a server on `port` (one a test reserved earlier, e.g. for a client started before its
    /// Redis); `None` (after a message) when Redis is not installed.
    pub fn start_on_port(port: u16, extra: &[&str]) -> Option<Self> {
        available().then(|| Self::start_on(port, extra))
    }

    fn start_on(port: u16, extra: &[&str]) -> Self {
        let dir =
            std::env::temp_dir().join(format!("tollgate-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut s = Self {
            port,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--protected-mode", "no", "--loglevel", "warning"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        self.wait_ping(Duration::from_secs(10));
    }

    /// Waits until the server answers PING.
    pub fn wait_ping(&self, within: Duration) -> Instant {
        let start = Instant::now();
        while !ping(self.port) {
            assert!(
                start.elapsed() < within,
                "redis-server on port {} did not answer PING within {within:?}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Instant::now()
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli -p <port> args...` and returns its output, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }

    /// Waits until a replica has acknowledged every write this primary has taken so far, or
    /// `within` passes; returns whether it did. (`WAIT` from a fresh `redis-cli` connection does
    /// not do this: it waits only for that connection's own writes, and it has made none.)
    pub fn replicated(&self, within: Duration) -> bool {
        let field = |info: &str, name: &str| -> Option<u64> {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
        };
        let info = self.cli(&["INFO", "replication"]);
        let Some(target) = field(&info, "master_repl_offset:") else {
            return false;
        };
        let start = Instant::now();
        loop {
            let info = self.cli(&["INFO", "replication"]);
            // `slave0:ip=...,port=...,state=online,offset=N,lag=...`
            let acked = info
                .lines()
                .filter(|l| l.starts_with("slave"))
                .filter_map(|l| l.split(',').find_map(|kv| kv.strip_prefix("offset=")))
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .any(|offset| offset >= target);
            if acked {
                return true;
            }
            if start.elapsed() > within {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} failed");
    }

    /// `kill -9` and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port (after [`kill9`](Self::kill9)); returns when it
    /// answers PING.
    pub fn restart(&mut self) -> Instant {
        self.kill9();
        self.spawn();
        Instant::now()
    }

    /// `kill -STOP`: the server hangs with its sockets open.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// `kill -CONT`.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// `calls` of `cmdstat_<name>` in `INFO commandstats` (0 when absent).
    pub fn command_calls(&self, name: &str) -> u64 {
        command_calls(&self.cli(&["INFO", "commandstats"]), name)
    }
}

/// `calls=` of `cmdstat_<name>` in an `INFO commandstats` text.
pub fn command_calls(info: &str, name: &str) -> u64 {
    let tag = format!("cmdstat_{name}:calls=");
    info.lines()
        .find_map(|l| l.trim().strip_prefix(&tag))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Cluster of three masters, without replicas (node timeout 2000 ms) or with one each.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three nodes and creates the Cluster; returns when every node reports
    /// `cluster_state:ok`. `None` when Redis is not installed.
    pub fn start() -> Option<Self> {
        Self::start_nodes(0, 2000)
    }

    /// Three masters with one replica each (six nodes; `nodes[0..3]` are the masters at first),
    /// the node timeout `node_timeout_ms` (how long a dead master goes unnoticed before its replica
    /// takes over); returns when the Cluster is ok and every replica is in sync.
    pub fn start_with_replicas(node_timeout_ms: u64) -> Option<Self> {
        let c = Self::start_nodes(1, node_timeout_ms)?;
        let start = Instant::now();
        for m in 0..3 {
            let r = c.replica_of(m);
            while !c.nodes[r]
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up")
            {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "replica {r} of master {m} never synced"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Some(c)
    }

    fn start_nodes(replicas: usize, node_timeout_ms: u64) -> Option<Self> {
        if !available() {
            return None;
        }
        let timeout = node_timeout_ms.to_string();
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| {
                let port = free_port();
                let conf = format!("nodes-{port}.conf");
                RedisServer::start_on(
                    port,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &conf,
                        "--cluster-node-timeout",
                        &timeout,
                    ],
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args: Vec<&str> = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        let replicas = replicas.to_string();
        args.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
        let out = Command::new("redis-cli")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let c = Self { nodes };
        c.wait_ok(Duration::from_secs(20));
        Some(c)
    }

    /// Waits until every running node reports `cluster_state:ok`.
    pub fn wait_ok(&self, within: Duration) -> Duration {
        let start = Instant::now();
        loop {
            let ok = self.nodes.iter().all(|n| {
                n.cli(&["CLUSTER", "INFO"])
                    .lines()
                    .any(|l| l.trim() == "cluster_state:ok")
            });
            if ok {
                return start.elapsed();
            }
            assert!(start.elapsed() < within, "cluster not ok within {within:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The node replicating `master` (by `CLUSTER NODES`: a `slave` line naming its id).
    pub fn replica_of(&self, master: usize) -> usize {
        // `cluster_state:ok` comes before every node has heard (by gossip) which node replicates
        // which: ask until the master's view names its replica.
        let start = Instant::now();
        loop {
            if let Some(i) = self.named_replica_of(master) {
                return i;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "master {master} has no replica"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn named_replica_of(&self, master: usize) -> Option<usize> {
        let id = self.nodes[master].cli(&["CLUSTER", "MYID"]);
        let nodes = self.nodes[master].cli(&["CLUSTER", "NODES"]);
        nodes.lines().find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if !(f.get(2).is_some_and(|flags| flags.contains("slave"))
                && f.get(3) == Some(&id.as_str()))
            {
                return None;
            }
            let port = f
                .get(1)
                .and_then(|a| a.split('@').next())
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse::<u16>().ok());
            self.nodes.iter().position(|n| Some(n.port) == port)
        })
    }

    /// Whether `node` is a master now (`ROLE`).
    pub fn is_master(&self, node: usize) -> bool {
        self.nodes[node].cli(&["ROLE"]).lines().next() == Some("master")
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// `CLUSTER KEYSLOT key`.
    pub fn keyslot(&self, key: &str) -> u16 {
        self.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("keyslot")
    }

    /// The node serving `slot` (by `CLUSTER SHARDS`-free parsing of `CLUSTER SLOTS` via ports).
    pub fn node_of_slot(&self, slot: u16) -> usize {
        for (i, n) in self.nodes.iter().enumerate() {
            let myself = n.cli(&["CLUSTER", "MYID"]);
            let nodes = n.cli(&["CLUSTER", "NODES"]);
            for line in nodes.lines() {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.first() != Some(&myself.as_str()) {
                    continue;
                }
                for range in f.iter().skip(8) {
                    let (a, b) = range.split_once('-').unwrap_or((range, range));
                    if let (Ok(a), Ok(b)) = (a.parse::<u16>(), b.parse::<u16>()) {
                        if (a..=b).contains(&slot) {
                            return i;
                        }
                    }
                }
            }
        }
        panic!("no node serves slot {slot}");
    }
}

/// What the fault proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forwards both ways.
    Pass,
    /// Forwards requests, swallows replies (the reply is lost after Redis ran the command).
    DropReplies,
    /// Forwards requests, then resets the client's connection instead of replying.
    ResetAfterForward,
}

/// A loopback TCP proxy in front of a server, with switchable faults.
pub struct FaultProxy {
    pub port: u16,
    mode: std::sync::Arc<std::sync::Mutex<ProxyMode>>,
}

impl FaultProxy {
    /// Starts forwarding `127.0.0.1:<port>` to `127.0.0.1:<upstream>` on the current tokio runtime.
    pub async fn start(upstream: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let mode = std::sync::Arc::new(std::sync::Mutex::new(ProxyMode::Pass));
        let shared = std::sync::Arc::clone(&mode);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    continue;
                };
                let mode = std::sync::Arc::clone(&shared);
                tokio::spawn(pipe(client, server, mode));
            }
        });
        Self { port, mode }
    }

    pub fn set(&self, mode: ProxyMode) {
        *self.mode.lock().unwrap_or_else(|e| e.into_inner()) = mode;
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

async fn pipe(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    mode: std::sync::Arc<std::sync::Mutex<ProxyMode>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let now = move || *mode.lock().unwrap_or_else(|e| e.into_inner());
    let reset = std::sync::Arc::new(tokio::sync::Notify::new());
    let reset_up = std::sync::Arc::clone(&reset);
    let now_up = now.clone();
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let Ok(n) = cr.read(&mut buf).await else {
                return;
            };
            if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                return;
            }
            if now_up() == ProxyMode::ResetAfterForward {
                reset_up.notify_one();
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            r = sr.read(&mut buf) => {
                let Ok(n) = r else { break };
                if n == 0 {
                    break;
                }
                if now() == ProxyMode::Pass && cw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            () = reset.notified() => break,
        }
    }
    up.abort();
    // Dropping both halves closes the client's connection.
}

/// One Redis Sentinel process (`redis-sentinel`, or `redis-server --sentinel` when the Debian
/// `redis-sentinel` package is missing: the same binary) watching one primary as `service`.
pub struct RedisSentinel {
    pub port: u16,
    child: Child,
}

impl RedisSentinel {
    /// Starts a sentinel (quorum 1, the primary deemed down after `down_after_ms`) and waits until
    /// it names the primary.
    pub fn start(service: &str, primary_port: u16, down_after_ms: u64) -> Self {
        Self::start_with(service, primary_port, down_after_ms, &[])
    }

    /// [`start`](Self::start) with extra configuration lines (e.g. `tls-port 1234`).
    pub fn start_with(
        service: &str,
        primary_port: u16,
        down_after_ms: u64,
        extra: &[String],
    ) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("tollgate-sentinel-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {}\n\
                 sentinel monitor {service} 127.0.0.1 {primary_port} 1\n\
                 sentinel down-after-milliseconds {service} {down_after_ms}\n\
                 sentinel failover-timeout {service} 2000\n{}\n",
                dir.display(),
                extra.join("\n"),
            ),
        )
        .expect("sentinel.conf");
        let sentinel_bin = Command::new("redis-sentinel")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let mut cmd = if sentinel_bin {
            let mut c = Command::new("redis-sentinel");
            c.arg(&conf);
            c
        } else {
            let mut c = Command::new("redis-server");
            c.arg(&conf).arg("--sentinel");
            c
        };
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-sentinel");
        let s = Self { port, child };
        let start = Instant::now();
        while s.primary_port(service).is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "sentinel on {port} did not name the primary"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    /// Runs `redis-cli -p <port> args...` against the sentinel's plain port.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }

    /// The port of the primary the sentinel names now.
    pub fn primary_port(&self, service: &str) -> Option<u16> {
        let out = cli(self.port, &["SENTINEL", "get-master-addr-by-name", service]);
        out.lines().nth(1).and_then(|p| p.trim().parse().ok())
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
