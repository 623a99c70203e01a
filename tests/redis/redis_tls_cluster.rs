//! A TLS Cluster through `rediss+cluster://`: three masters with `--tls-cluster yes` (the
//! Cluster bus on TLS too), certificates made at test time by the TLS tests' CA.
//!
//! The bus always asks the connecting node for a certificate, and a node presents its
//! `--tls-client-cert-file` (else its server certificate, whose `extendedKeyUsage` is
//! `serverAuth` only: refused with "certificate verify failed", the nodes never meet and
//! `redis-cli --cluster create` waits for them for ever). The Cluster is made with
//! `CLUSTER ADDSLOTSRANGE` and `CLUSTER MEET` on each node's TLS port, with a deadline, so a
//! handshake that fails is an assertion with the nodes' view, never a hang.

use crate::redis_faults::rt;
use crate::redis_support::{RedisCluster, RedisServer, free_port};
use crate::redis_tls::certificates;

use std::path::Path;
use std::time::{Duration, Instant};

use tollgate::store::redis::RedisStore;
use tollgate::store::{Scope, Store};
use tollgate::{Op, Rule, Strategy};

/// The slots of each of the three masters.
const SLOTS: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// Three Cluster nodes with a TLS port each (a plain one too, for the harness's commands), the
/// bus on TLS, the Cluster made and `ok`; their TLS ports. Bus connections present the client
/// certificate (the bus always asks for one).
fn tls_cluster(dir: &Path) -> Option<(RedisCluster, Vec<u16>)> {
    let p = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let mut nodes = Vec::new();
    let mut tls_ports = Vec::new();
    for _ in 0..3 {
        // Both ports with their bus port (+10000) free: the bus listens at the TLS port's.
        let (port, tls) = (free_port(), free_port());
        let conf = format!("nodes-{port}.conf");
        let tls_s = tls.to_string();
        let node = RedisServer::start_on_port(
            port,
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &conf,
                "--cluster-node-timeout",
                "2000",
                "--tls-port",
                &tls_s,
                "--tls-cluster",
                "yes",
                "--tls-cert-file",
                &p("server.crt"),
                "--tls-key-file",
                &p("server.key"),
                "--tls-client-cert-file",
                &p("client.crt"),
                "--tls-client-key-file",
                &p("client.key"),
                "--tls-ca-cert-file",
                &p("ca.crt"),
                "--tls-auth-clients",
                "no",
            ],
        )?;
        nodes.push(node);
        tls_ports.push(tls);
    }
    for (node, (from, to)) in nodes.iter().zip(SLOTS) {
        let (from, to) = (from.to_string(), to.to_string());
        let ok = node.cli(&["CLUSTER", "ADDSLOTSRANGE", &from, &to]);
        assert_eq!(ok, "OK", "ADDSLOTSRANGE {from} {to}");
    }
    for tls in &tls_ports[1..] {
        let ok = nodes[0].cli(&["CLUSTER", "MEET", "127.0.0.1", &tls.to_string()]);
        assert_eq!(ok, "OK", "CLUSTER MEET 127.0.0.1 {tls}");
    }
    let cluster = RedisCluster { nodes };
    let start = Instant::now();
    // Every node knows the other two (the handshakes went through on TLS), then every slot is
    // served: `cluster_state:ok`.
    while !cluster.nodes.iter().all(|n| {
        n.cli(&["CLUSTER", "INFO"])
            .contains("cluster_known_nodes:3")
    }) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the TLS Cluster's nodes never met: {}",
            cluster.nodes[0].cli(&["CLUSTER", "NODES"])
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    cluster.wait_ok(Duration::from_secs(20));
    Some((cluster, tls_ports))
}

#[test]
fn rediss_cluster_decides_exactly_across_slots_on_every_master_over_tls() {
    let Some(dir) = certificates() else {
        return;
    };
    let Some((cluster, tls_ports)) = tls_cluster(&dir) else {
        return;
    };
    rt().block_on(async {
        // One seed is enough: the others are learned from the Cluster (their TLS ports).
        let url = format!("rediss+cluster://127.0.0.1:{}", tls_ports[0]);
        let store = RedisStore::builder(&url)
            .tls_ca_file(dir.join("ca.crt"))
            .build()
            .await
            .expect("TLS Cluster with the test CA");
        let rule = Rule::parse(Strategy::SlidingWindow, "3/minute").unwrap();
        let keys: Vec<String> = (0..24).map(|i| format!("tls-user-{i}")).collect();
        for key in &keys {
            let mut admitted = 0;
            for _ in 0..5 {
                let d = store
                    .apply(key, Scope::new("default", &rule), Op::Check(1), 0)
                    .await
                    .expect("a decision over TLS");
                admitted += u32::from(d.is_allowed());
            }
            assert_eq!(admitted, 3, "{key}: exactly the limit");
        }
        for (i, (node, tls)) in cluster.nodes.iter().zip(&tls_ports).enumerate() {
            let held: u64 = node.cli(&["DBSIZE"]).parse().unwrap_or(0);
            assert!(
                held > 0,
                "master {i} decided none of the {} keys",
                keys.len()
            );
            // The store reached this master on its TLS port (the harness uses the plain one).
            let clients = node.cli(&["CLIENT", "LIST"]);
            let laddr = format!("laddr=127.0.0.1:{tls}");
            assert!(
                clients.lines().any(|l| l.contains(&laddr)),
                "no client on master {i}'s TLS port {tls}:\n{clients}"
            );
        }
        let c = store.counters();
        assert_eq!((c.shed, c.breaker_opens, c.timed_out), (0, 0, 0), "{c:?}");
        // Without the test CA the handshake is refused at start, on a Cluster as on one node.
        let e = RedisStore::connect(&url)
            .await
            .expect_err("an unknown CA fails the build");
        assert!(
            e.to_string().to_ascii_lowercase().contains("certificate"),
            "{e}"
        );
    });
}
