//! A nemesis run: HTTP clients and an idempotent Kafka producer append through a gateway
//! while streamd nodes are killed and restarted, paused past their timeout and resumed,
//! stopped with SIGTERM (a drain by planned transfer), have their link to metad cut,
//! blackholed or slowed, their link to the object store or the gateway's links to them
//! and to metad cut or blackholed, by fault-injecting proxies, at random. After healing, every
//! stream is read back and the history checker verifies that every acknowledged record
//! is there, once, in order (INV-1 to INV-3). The object WAL's runs add 25–55 ms to every
//! object-store request (issue 58).
//!
//! Seeded: the seed is printed, and `WEIR_SEED=<seed>` (or `WEIR_NEMESIS_SEED`) replays a run (the seed
//! also picks the file or the object WAL). `WEIR_NEMESIS_SECS` sets its length (CI runs
//! a short one; 20 s by default), and `WEIR_NEMESIS_RUNS` how many runs follow each
//! other, seeds counting up from the first: the long mode is
//! `WEIR_NEMESIS_RUNS=50 WEIR_NEMESIS_SECS=120`.
// Test tasks end with the test process; the services spawn only on trackers (clippy.toml).
#![allow(clippy::disallowed_methods)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_tests::gateway::Gatewayd;
use weir_tests::history::{History, Outcome};
use weir_tests::proxy::{Mode, Proxy};
use weir_tests::streamd::{Backend, Stack};
use weir_tests::tail_of;

const STREAMS: [&str; 4] = ["n-0", "n-1", "n-2", "n-3"];
/// The Kafka producer's topic (one partition: stream `nk/0`).
const TOPIC: &str = "nk";

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Sends of the Kafka producer in flight at once: several batches queued per
/// connection, so their order is checked under the faults.
const KAFKA_IN_FLIGHT: usize = 8;

/// An idempotent Kafka producer (librdkafka) sending unique payloads `k-<i>`, up to
/// [`KAFKA_IN_FLIGHT`] at once, until `stop`; a delivery report is an ack at its
/// offset, a failed one an unknown outcome.
async fn kafka_client(gw: Arc<Gatewayd>, history: Arc<History>, stop: Arc<AtomicBool>) {
    use futures::stream::{FuturesOrdered, StreamExt};
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &gw.kafka)
        .set("broker.address.family", "v4")
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "2")
        .set("message.timeout.ms", "60000")
        .set("topic.metadata.refresh.interval.ms", "1000")
        .create()
        .expect("producer");
    let stream = format!("{TOPIC}/0");
    let mut in_flight = FuturesOrdered::new();
    let mut i = 0;
    loop {
        while !stop.load(Ordering::Relaxed) && in_flight.len() < KAFKA_IN_FLIGHT {
            let payload = format!("k-{i}");
            i += 1;
            // Queued now, so librdkafka sends them in this order.
            let queued = producer
                .send_result(FutureRecord::<(), _>::to(TOPIC).partition(0).payload(&payload))
                .map_err(|(e, _)| e);
            in_flight.push_back(async move {
                let outcome = match queued {
                    Ok(delivery) => match delivery.await {
                        Ok(Ok(d)) => Outcome::Ok(d.offset as u64),
                        _ => Outcome::Unknown,
                    },
                    // Never handed to the client (its queue was full): never sent.
                    Err(_) => Outcome::Failed,
                };
                (payload, outcome)
            });
        }
        let Some((payload, outcome)) = in_flight.next().await else {
            return;
        };
        let failed = !matches!(outcome, Outcome::Ok(_));
        history.record(&stream, &payload, outcome);
        if failed {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The Kafka producer's acknowledged payloads, by offset, must be in the order they
/// were sent: it is idempotent, so no batch may overtake an earlier one.
fn kafka_send_order_problems(history: &History, stream: &str) -> Vec<String> {
    let mut acked: Vec<(u64, u64)> = history
        .attempts()
        .into_iter()
        .filter(|a| a.stream == stream)
        .filter_map(|a| match a.outcome {
            Outcome::Ok(offset) => Some((offset, a.payload.trim_start_matches("k-").parse().ok()?)),
            _ => None,
        })
        .collect();
    acked.sort();
    acked
        .windows(2)
        .filter(|w| w[1].1 < w[0].1)
        .map(|w| format!("{stream}: k-{} at {} after k-{} at {}", w[1].1, w[1].0, w[0].1, w[0].0))
        .collect()
}

/// What one run did, for the long mode's summary.
struct Run {
    seed: u64,
    backend: Backend,
    faults: Vec<String>,
    attempts: usize,
    acknowledged: usize,
    problems: Vec<String>,
}

// INV-1, INV-2, INV-3: every acknowledged record is read back once, in order, whatever
// the faults. `WEIR_NEMESIS_RUNS=50 WEIR_NEMESIS_SECS=120` is the long mode: it goes on
// through a run that finds a violation and reports every run before it fails.
#[tokio::test(flavor = "multi_thread")]
async fn nemesis_kill_pause_and_stop_streamd_nodes_while_clients_append() {
    let first = env_u64("WEIR_SEED")
        .or_else(|| env_u64("WEIR_NEMESIS_SEED"))
        .unwrap_or_else(rand::random);
    let secs = env_u64("WEIR_NEMESIS_SECS").unwrap_or(20);
    let runs = env_u64("WEIR_NEMESIS_RUNS").unwrap_or(1).max(1);
    let mut done = Vec::new();
    for i in 0..runs {
        let seed = first.wrapping_add(i);
        println!(
            "nemesis run {}/{runs}: seed {seed} ({secs} s); replay with WEIR_SEED={seed}",
            i + 1
        );
        // A run that panics (a heal that times out, an exit status) is reported with
        // the others, not lost with the loop.
        let run = tokio::spawn(run(seed, secs)).await.unwrap_or_else(|e| Run {
            seed,
            backend: backend_of(seed),
            faults: Vec::new(),
            attempts: 0,
            acknowledged: 0,
            problems: vec![format!("the run panicked: {}", panic_text(e))],
        });
        println!(
            "nemesis run {}/{runs}: seed {seed}, {:?}, {} faults, {} of {} appends acknowledged, {} violations",
            i + 1,
            run.backend,
            run.faults.len(),
            run.acknowledged,
            run.attempts,
            run.problems.len()
        );
        done.push(run);
    }
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for f in done.iter().flat_map(|r| &r.faults) {
        let kind: Vec<&str> = f.split(' ').take_while(|w| !w.starts_with("streamd-")).collect();
        *kinds.entry(kind.join(" ")).or_default() += 1;
    }
    println!(
        "nemesis: {} runs ({} object WAL) of {secs} s, {} faults {kinds:?}, {} acknowledged appends, {} violations",
        done.len(),
        done.iter().filter(|r| matches!(r.backend, Backend::ObjectWal)).count(),
        done.iter().map(|r| r.faults.len()).sum::<usize>(),
        done.iter().map(|r| r.acknowledged).sum::<usize>(),
        done.iter().map(|r| r.problems.len()).sum::<usize>()
    );
    assert!(
        done.iter().all(|r| r.acknowledged > 0),
        "clients made progress in every run"
    );
    let failed: Vec<_> = done
        .iter()
        .filter(|r| !r.problems.is_empty())
        .map(|r| (r.seed, &r.problems))
        .collect();
    // INV-2: no acknowledged payload is lost: each is read back after the faults heal.
    // INV-1: every acked payload is read back at its acked offset (no second writer).
    // INV-11: no payload whose only attempt was refused (503 before admission) is stored.
    // INV-13: no payload is stored twice (each is sent once, so no duplicate is allowed).
    // FO-TKO-13: through the takeovers these faults cause, no acked payload is lost or moved.
    assert!(failed.is_empty(), "violations by seed: {failed:#?}");
}

/// The seed picks the WAL: even seeds the file WAL, odd ones the object WAL.
fn backend_of(seed: u64) -> Backend {
    if seed.is_multiple_of(2) {
        Backend::FileWal
    } else {
        Backend::ObjectWal
    }
}

fn panic_text(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
        Err(e) => e.to_string(),
    }
}

/// One seeded run: the backend (file or object WAL) and every fault come from the seed.
async fn run(seed: u64, secs: u64) -> Run {
    let mut rng = StdRng::seed_from_u64(seed);
    let backend = backend_of(seed);

    // Every link goes through a proxy of its own, so each can be faulted: each streamd's
    // to metad and to the object store, gatewayd's to each streamd and to metad.
    let mut stack = Stack::start_with(0, backend, &[], &[]).await;
    let s3 = stack.s3.endpoint.trim_start_matches("http://").to_string();
    let mut links = Vec::new();
    let mut data_links = Vec::new();
    let mut store_links = Vec::new();
    for i in 0..3 {
        let link = Proxy::start(&stack.metad.replicas[0].grpc).await;
        let store = Proxy::start(&s3).await;
        // Issue 58: the object WAL's runs see a real object store's latency, so its
        // PUTs are in flight when the faults strike.
        if backend == Backend::ObjectWal {
            store.delay_requests(Duration::from_millis(25), Duration::from_millis(55));
        }
        let endpoint = format!("http://{}", store.addr);
        let data = stack
            .add_node_behind_proxy_with_env(
                &format!("streamd-{}", i + 1),
                backend,
                &["--metad", &link.addr],
                &[("AWS_ENDPOINT", &endpoint)],
            )
            .await;
        links.push(link);
        data_links.push(data);
        store_links.push(store);
    }
    for n in &stack.nodes {
        n.wait_ready().await;
    }
    let gw_link = Proxy::start(&stack.metad.replicas[0].grpc).await;
    let gw = Arc::new(Gatewayd::start("gw-1", &gw_link.addr, stack.dir.path(), &[]));
    gw.wait_ready().await;
    for s in STREAMS {
        gw.create_stream(s).await;
        gw.wait_open(s).await;
    }
    stack.metad.create_topic(TOPIC, 1).await;
    gw.wait_open(&format!("{TOPIC}/0")).await;
    let history = Arc::new(History::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = weir_tests::writer::spawn_clients(&gw, &STREAMS, 0, &history, &stop);
    clients.push(tokio::spawn(kafka_client(gw.clone(), history.clone(), stop.clone())));

    let started = Instant::now();
    let mut faults = Vec::new();
    while started.elapsed() < Duration::from_secs(secs) {
        let victim = rng.random_range(0..stack.nodes.len());
        let fault = rng.random_range(0..11);
        match fault {
            0 => {
                stack.nodes[victim].kill();
                tokio::time::sleep(Duration::from_millis(rng.random_range(100..3000))).await;
                stack.nodes[victim].start();
                faults.push(format!("kill+restart {}", stack.nodes[victim].id));
            }
            1 => {
                stack.nodes[victim].pause();
                tokio::time::sleep(Duration::from_millis(rng.random_range(500..6000))).await;
                stack.nodes[victim].resume();
                // A node fenced while paused exits 75 on resuming; start it again.
                if let Some(code) = stack.nodes[victim].wait_exit_if_exited(Duration::from_secs(3)).await {
                    assert_eq!(code, 75, "a fenced node exits 75");
                    stack.nodes[victim].start();
                }
                faults.push(format!("pause+resume {}", stack.nodes[victim].id));
            }
            3 | 4 => {
                let mode = if fault == 3 { Mode::Cut } else { Mode::Blackhole };
                links[victim].set(mode);
                tokio::time::sleep(Duration::from_millis(rng.random_range(500..6000))).await;
                links[victim].set(Mode::Pass);
                // Cut off past the timeout, it was fenced: it exits 75 once it sees so.
                if let Some(code) = stack.nodes[victim].wait_exit_if_exited(Duration::from_secs(3)).await {
                    assert_eq!(code, 75, "a fenced node exits 75");
                    stack.nodes[victim].start();
                }
                faults.push(format!("{mode:?} link to metad {}", stack.nodes[victim].id));
            }
            6 | 7 => {
                // The gateway's link to one node: requests to its streams fail or time
                // out (unknown outcomes) while the node itself stays live.
                let mode = if fault == 6 { Mode::Cut } else { Mode::Blackhole };
                data_links[victim].set(mode);
                tokio::time::sleep(Duration::from_millis(rng.random_range(500..4000))).await;
                data_links[victim].set(Mode::Pass);
                faults.push(format!("{mode:?} gateway link to {}", stack.nodes[victim].id));
            }
            8 | 9 => {
                // The node's link to the object store: uploads (and with the object WAL,
                // appends) stall or fail. A WAL write that fails for good fences the
                // node (exit 75), as a supervisor would restart it, so does this.
                let mode = if fault == 8 { Mode::Cut } else { Mode::Blackhole };
                store_links[victim].set(mode);
                tokio::time::sleep(Duration::from_millis(rng.random_range(500..4000))).await;
                store_links[victim].set(Mode::Pass);
                if let Some(code) = stack.nodes[victim].wait_exit_if_exited(Duration::from_secs(3)).await {
                    assert_eq!(code, 75, "a fenced node exits 75");
                    stack.nodes[victim].start();
                }
                faults.push(format!("{mode:?} object store link of {}", stack.nodes[victim].id));
            }
            10 => {
                // The gateway's link to metad: its view stops following the log. Kept
                // short of the node timeout, though faults in a row can outlast it: the
                // gateway is then fenced and exits 75, and is restarted after the faults
                // (as its supervisor would).
                let mode = if rng.random_bool(0.5) {
                    Mode::Cut
                } else {
                    Mode::Blackhole
                };
                gw_link.set(mode);
                tokio::time::sleep(Duration::from_millis(rng.random_range(300..1800))).await;
                gw_link.set(Mode::Pass);
                faults.push(format!("{mode:?} gateway link to metad"));
            }
            5 => {
                let delay = Duration::from_millis(rng.random_range(50..400));
                links[victim].delay(delay);
                tokio::time::sleep(Duration::from_millis(rng.random_range(1000..4000))).await;
                links[victim].delay(Duration::ZERO);
                faults.push(format!("delay {delay:?} link to metad {}", stack.nodes[victim].id));
            }
            _ => {
                stack.nodes[victim].term();
                let code = stack.nodes[victim].wait_exit(Duration::from_secs(60)).await;
                let log = stack.nodes[victim].run_log_text();
                if code == Some(75) {
                    // An earlier fault fenced it before the signal, so it stopped as a
                    // fenced node does; its log must say so.
                    assert!(
                        log.contains("this incarnation is fenced; stopping"),
                        "exit 75 without being fenced: {}",
                        tail_of(&log, 4000)
                    );
                } else {
                    // SD-EX-1: nothing stalls a stop here, so none is forced.
                    weir_tests::assert_graceful_exit(code, &log);
                }
                stack.nodes[victim].start();
                faults.push(format!("sigterm+restart {}", stack.nodes[victim].id));
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..2000))).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("client");
    }
    println!("faults: {faults:?}");
    // A node fenced during a late fault may exit only now; bring every node back.
    for n in &mut stack.nodes {
        if let Some(code) = n.wait_exit_if_exited(Duration::from_millis(500)).await {
            // Only a fence ends a node here: every SIGTERM was followed by a restart.
            assert_eq!(code, 75, "{} exited {code}: {}", n.id, tail_of(&n.run_log_text(), 4000));
            n.start();
        }
    }
    // So may the gateway: its link to metad is faulted too, and a gateway fenced for
    // missed heartbeats exits 75 and is restarted (as compose's restart policy does).
    let mut gw = gw;
    {
        let gateway = Arc::get_mut(&mut gw).expect("the clients are done with the gateway");
        if let Some(code) = gateway.proc().exited_within(Duration::from_millis(500)).await {
            let log = gateway.log_text();
            assert_eq!(code, 75, "gw-1 exited {code}: {}", tail_of(&log, 4000));
            faults.push("gw-1 fenced; restarted".to_string());
            gateway.spawn();
            gateway.wait_ready().await;
        }
    }

    // Heal: every stream open again (dumping the metadata state if one is not).
    let kafka_stream = format!("{TOPIC}/0");
    let all_streams: Vec<&str> = STREAMS.iter().copied().chain([kafka_stream.as_str()]).collect();
    for &s in &all_streams {
        let open = tokio::time::timeout(Duration::from_secs(60), gw.wait_open(s)).await;
        if open.is_err() {
            let state = stack.metad.replicas[0].http_json("/admin/state/state").await;
            let log = stack.metad.replicas[0].log_text();
            let tail = match log.find("panicked at") {
                // 3,000 bytes before the panic and 1,500 after it.
                Some(at) => {
                    let mut end = (at + 1500).min(log.len());
                    while !log.is_char_boundary(end) {
                        end += 1;
                    }
                    tail_of(&log[..end], end - at + 3000)
                }
                None => tail_of(&log, 6000),
            };
            // Each streamd's last warnings and errors, and what it did about takeovers.
            let nodes: String = stack
                .nodes
                .iter()
                .map(|n| {
                    let text = n.log_text();
                    let lines: Vec<&str> = text
                        .lines()
                        .filter(|l| l.contains("\"WARN\"") || l.contains("\"ERROR\"") || l.contains("takeover"))
                        .collect();
                    format!(
                        "--- {}:\n{}\n",
                        n.id,
                        lines[lines.len().saturating_sub(25)..].join("\n")
                    )
                })
                .collect();
            let gw_log = gw.log_text();
            panic!(
                "seed {seed}: {s} not open again; metadata state: {}\nmetad log tail:\n{tail}\nstreamd logs:\n{nodes}\ngatewayd log tail:\n{}",
                serde_json::to_string_pretty(&state).unwrap_or_default(),
                tail_of(&gw_log, 6000)
            );
        }
    }
    let read_back = weir_tests::writer::read_back(&gw, &all_streams).await;
    let mut problems = history.check(&read_back);
    problems.extend(kafka_send_order_problems(&history, &kafka_stream));
    Run {
        seed,
        backend,
        faults,
        attempts: history.attempts().len(),
        acknowledged: history.acknowledged(),
        problems,
    }
}
