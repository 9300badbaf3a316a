//! Smoke test of `braid bench`: a broker on a free port, `braid bench pub --sub 1` at QoS 1 for
//! about two seconds, and the JSON summary must show every message received exactly once.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const BRAID: &str = env!("CARGO_BIN_EXE_braid");

struct Broker(Child);

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A broker on a port of its own choosing (port 0), read back from its log: picking a free
/// port first and passing it races with the other tests, which run in parallel.
fn start_broker() -> (Broker, u16) {
    let mut child = Command::new(BRAID)
        .args(["serve", "--listen", "127.0.0.1:0", "--set", "log.level=\"info\""])
        .args(["--set", "store.backend=\"memory\""])
        // QUIC on a free port too: the default 14567 is taken by the first broker.
        .args(["--set", "listeners.quic=\"127.0.0.1:0\""])
        // And the HTTP admin listener (default 127.0.0.1:18083).
        .args(["--set", "listeners.http=\"127.0.0.1:0\""])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("braid serve starts");
    let mut log = BufReader::new(child.stderr.take().unwrap()).lines();
    let broker = Broker(child);
    let port = loop {
        let line = log.next().expect("braid serve logs its TCP address").unwrap();
        if line.contains("listening for MQTT") && line.contains("transport=\"tcp\"") {
            break line.rsplit(':').next().unwrap().trim().parse().expect("a port at the end of the line");
        }
    };
    // Keep reading, so the broker never blocks on a full pipe.
    std::thread::spawn(move || log.for_each(drop));
    (broker, port)
}

fn bench(args: &[&str]) -> serde_json::Value {
    let out = Command::new(BRAID).arg("bench").args(args).output().expect("braid bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "braid bench {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("summary is not JSON ({e}): {stdout}"))
}

#[test]
fn pub_with_sub_at_qos1_loses_nothing() {
    let (_broker, port) = start_broker();
    let port = port.to_string();
    let s = bench(&[
        "pub",
        "-p",
        &port,
        "-c",
        "4",
        "-i",
        "0",
        "-I",
        "1",
        "-q",
        "1",
        "-F",
        "8",
        "-s",
        "256",
        "-t",
        "smoke/%i",
        "--sub",
        "2",
        "--duration",
        "2",
        "--json",
    ]);
    let published = s["published"].as_u64().unwrap();
    assert!(published > 100, "{s}");
    assert_eq!(s["pub_fail"], 0, "{s}");
    assert_eq!(s["received"].as_u64().unwrap(), published * 2, "{s}");
    assert_eq!(s["expected"].as_u64().unwrap(), published * 2, "{s}");
    assert_eq!(s["lost"], 0, "{s}");
    assert_eq!(s["duplicates"], 0, "{s}");
    assert_eq!(s["out_of_order"], 0, "{s}");
    assert_eq!(s["latency_ns"]["count"].as_u64().unwrap(), published * 2, "{s}");
    assert!(s["latency_ns"]["p50"].as_u64().unwrap() > 0, "{s}");
}

#[test]
fn separate_sub_and_conn_modes() {
    let (_broker, port) = start_broker();
    let port = port.to_string();
    // A short-stamp (10 B) publisher with its own subscriber, then idle connections. QoS 1: an
    // unpaced QoS 0 flood may be dropped by the broker's queue policy, which is not what this
    // test is about.
    let s = bench(&[
        "pub",
        "-p",
        &port,
        "-c",
        "1",
        "-I",
        "0",
        "-q",
        "1",
        "-s",
        "10",
        "-t",
        "smoke/tiny",
        "-L",
        "2000",
        "--sub",
        "1",
        "--json",
        "--quiet",
    ]);
    assert_eq!(s["published"], 2000, "{s}");
    assert_eq!(s["received"], 2000, "{s}");
    assert_eq!(s["lost"], 0, "{s}");
    assert_eq!(s["unstamped"], 0, "{s}");
    let c = bench(&["conn", "-p", &port, "-c", "50", "-i", "0", "--duration", "0.5", "--json", "--quiet"]);
    assert_eq!(c["connect_succ"], 50, "{c}");
    assert_eq!(c["connect_fail"], 0, "{c}");
    assert!(c["connect_rate"].as_f64().unwrap() > 0.0, "{c}");
}

#[test]
fn lean_conn_clients_subscribe_receive_and_come_back_after_a_storm() {
    let (_broker, port) = start_broker();
    let port = port.to_string();
    // 300 raw-socket clients from two source addresses, each on its own topic and on a shared
    // one, publishing to their own topic every 100 ms; a storm half a second after the ramp, then
    // a broadcast from another process.
    let mut conn = Command::new(BRAID)
        .args(["bench", "conn", "-p", &port, "-c", "300", "-i", "0", "-V", "4"])
        .args(["-t", "lean/%i", "-t", "lean/all", "-I", "100", "--ifaddr", "127.0.0.1,127.0.0.2"])
        .args(["--storm-after", "0.5", "--duration", "60", "--json", "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("braid bench conn starts");
    let mut progress = BufReader::new(conn.stderr.take().unwrap()).lines();
    let back = progress.find(|l| l.as_ref().is_ok_and(|l| l.contains(" back in "))).unwrap().unwrap();
    assert!(back.starts_with("storm: 300 of 300 back"), "{back}");
    std::thread::spawn(move || progress.for_each(drop));
    bench(&["pub", "-p", &port, "-c", "1", "-L", "1", "-t", "lean/all", "-s", "18", "--json", "--quiet"]);
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(Command::new("kill").args(["-INT", &conn.id().to_string()]).status().unwrap().success());
    let out = conn.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let s: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!((s["connect_succ"].as_u64(), s["connect_fail"].as_u64()), (Some(300), Some(0)), "{s}");
    assert_eq!(s["sub"], 300, "{s}");
    assert_eq!(s["broadcast_received"], 300, "{s}");
    assert_eq!(s["broadcast_latency_ns"]["count"], 300, "{s}");
    assert_eq!((s["storm_clients"].as_u64(), s["storm_back"].as_u64()), (Some(300), Some(300)), "{s}");
    assert_eq!(s["disconnected"], 0, "{s}");
    // Own-topic messages come back to their publisher, with a latency; the broadcast apart.
    let own = s["received"].as_u64().unwrap() - 300;
    assert!(own >= 300, "{s}");
    assert!(own <= s["published"].as_u64().unwrap(), "{s}");
    assert_eq!(s["latency_ns"]["count"].as_u64(), Some(own), "{s}");
    assert!(s["tool_rss_per_conn_bytes"].as_u64().unwrap() > 0, "{s}");
}
