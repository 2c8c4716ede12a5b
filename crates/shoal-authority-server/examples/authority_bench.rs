//! Write latency of a 3-replica authority on this machine: request -> Raft commit on a quorum
//! (fsync'd logs) -> signed reply, measured at the client, for N transitions.
//!
//! Starts three replicas **in this process** (each with its own data dir, both transports,
//! real QUIC + mTLS over loopback) and one client, registers N/2 instances and moves each to
//! READY (N transitions in total, sequential, one in flight), then prints p50/p90/p99/max.
//!
//! `cargo run --release -p shoal-authority-server --example authority_bench -- 1000`
//!
//! With `IDLE_SECS=60` it then idles that long and prints how far the applied index moved
//! (the steady-state authority write rate: must be zero).

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use shoal_authority_server::client::AuthorityClient;
use shoal_authority_server::config::{to_hex, AuthorityConfig};
use shoal_authority_server::server::Replica;
use shoal_proto::rpc::{AuthorityOk, AuthorityRequestBody};
use shoal_proto::{LifecycleState, NodeId, Region, TransitionReason};
use shoal_transport::certs::{generate_ca, generate_node_cert, ExtraSans, Validity};

fn port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args().nth(1).map_or(Ok(1000), |s| s.parse())?;
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    let region: Region = "bench-1".parse()?;
    let v = || Validity::from_now(Duration::from_secs(3600));
    let ca = generate_ca(&region, v())?;
    std::fs::write(root.join("ca.pem"), &ca.cert_pem)?;
    std::fs::write(root.join("region.key"), to_hex(&[5; 32]))?;
    let addrs: Vec<(SocketAddr, SocketAddr)> = (0..3)
        .map(|_| {
            (
                format!("127.0.0.1:{}", port()).parse().unwrap(),
                format!("127.0.0.1:{}", port()).parse().unwrap(),
            )
        })
        .collect();
    let mut members = String::new();
    for (i, (r, p)) in addrs.iter().enumerate() {
        members.push_str(&format!(
            "[[members]]\nid = {}\nnode = \"auth-{}\"\nraft_addr = \"{r}\"\nrpc_addr = \"{p}\"\n\n",
            i + 1,
            i + 1
        ));
    }
    let mut replicas = Vec::new();
    for i in 1..=3u64 {
        let node: NodeId = format!("auth-{i}").parse()?;
        let pair = generate_node_cert(&ca, &node, &region, &ExtraSans::default(), v())?;
        std::fs::write(root.join(format!("{i}.pem")), &pair.cert_pem)?;
        std::fs::write(root.join(format!("{i}.key")), &pair.key_pem)?;
        let text = format!(
            "id = {i}\nregion = \"bench-1\"\ndata_dir = \"{d}/data-{i}\"\ntls = {{ ca = \"{d}/ca.pem\", cert = \"{d}/{i}.pem\", \
             key = \"{d}/{i}.key\" }}\nsigning_key = \"{d}/region.key\"\n\n{members}",
            d = root.display()
        );
        let cfg: AuthorityConfig = toml::from_str(&text)?;
        replicas.push(Replica::start(cfg).await?);
    }
    let client_node: NodeId = "node-bench".parse()?;
    let pair = generate_node_cert(&ca, &client_node, &region, &ExtraSans::default(), v())?;
    let client = AuthorityClient::connect(
        "127.0.0.1:0".parse()?,
        &ca.cert_pem,
        &pair.cert_pem,
        &pair.key_pem,
    )?;
    let rpc: Vec<SocketAddr> = addrs.iter().map(|a| a.1).collect();
    // Wait for a leader (and its takeover entry) before measuring.
    let warm = client
        .write(&rpc, register(0), Duration::from_secs(30))
        .await
        .map_err(|e| anyhow::anyhow!("warm-up: {e}"))?;
    let AuthorityOk::Committed { records } = warm else {
        anyhow::bail!("warm-up answer")
    };
    let mut leader = rpc[0];
    for a in &rpc {
        if let Ok(Ok(_)) = client.call(*a, register(0), Duration::from_secs(3)).await {
            leader = *a;
            break;
        }
    }
    let _ = records;
    let mut lat = Vec::with_capacity(n);
    let started = Instant::now();
    for i in 1..=(n / 2) as u32 {
        let t = Instant::now();
        let r = client
            .call(leader, register(i), Duration::from_secs(5))
            .await?;
        lat.push(t.elapsed());
        let Ok(AuthorityOk::Committed { records }) = r else {
            anyhow::bail!("register {i}: {r:?}")
        };
        let generation = records[0].record.generation;
        let t = Instant::now();
        let r = client
            .call(
                leader,
                AuthorityRequestBody::Transition {
                    key: "prod/bench/http".parse()?,
                    instance: format!("b-{i}").parse()?,
                    generation,
                    to: LifecycleState::Ready,
                    reason: TransitionReason::ReadinessPassed,
                },
                Duration::from_secs(5),
            )
            .await?;
        lat.push(t.elapsed());
        anyhow::ensure!(
            matches!(r, Ok(AuthorityOk::Committed { .. })),
            "ready {i}: {r:?}"
        );
    }
    let wall = started.elapsed();
    lat.sort();
    let q = |p: f64| lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1];
    println!(
        "writes={} wall={:.2}s rate={:.0}/s p50={:.2}ms p90={:.2}ms p99={:.2}ms max={:.2}ms",
        lat.len(),
        wall.as_secs_f64(),
        lat.len() as f64 / wall.as_secs_f64(),
        q(0.50).as_secs_f64() * 1e3,
        q(0.90).as_secs_f64() * 1e3,
        q(0.99).as_secs_f64() * 1e3,
        lat.last().unwrap().as_secs_f64() * 1e3,
    );
    if let Some(secs) = std::env::var("IDLE_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        // Steady state: nothing but the authority's own duties may write.
        let applied = |r: &Replica| r.status().applied_index;
        let before: Vec<u64> = replicas.iter().map(|r| applied(r)).collect();
        tokio::time::sleep(Duration::from_secs(secs)).await;
        let after: Vec<u64> = replicas.iter().map(|r| applied(r)).collect();
        println!(
            "idle {secs}s with {} instances: applied index before={before:?} after={after:?} -> {:.3} writes/s",
            n / 2,
            (after[0] - before[0]) as f64 / secs as f64
        );
    }
    client.shutdown().await;
    for r in &replicas {
        r.shutdown().await;
    }
    Ok(())
}

fn register(i: u32) -> AuthorityRequestBody {
    AuthorityRequestBody::Register {
        key: "prod/bench/http".parse().unwrap(),
        instance: format!("b-{i}").parse().unwrap(),
        on_node: None,
        endpoint: shoal_catalog::testkit::Fixture::spec(i.max(1)),
        lease_ms: 60_000,
    }
}
