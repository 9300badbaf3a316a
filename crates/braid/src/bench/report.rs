//! Output: one line per second per counter that moved (`5s pub total=48 rate=9.97/sec`, as
//! emqtt_bench prints), and the final summary, as text or as JSON (`--json`).

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::stats::{Counter, Stats};

/// `5s`, `1m1s`, `2h0m3s`: elapsed time as emqtt_bench prints it.
pub(crate) fn fmt_elapsed(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// One per-second line.
pub(crate) fn line(elapsed_secs: u64, name: &str, total: u64, delta: u64, interval: Duration) -> String {
    let rate = delta as f64 / interval.as_secs_f64().max(1e-9);
    format!("{} {name} total={total} rate={rate:.2}/sec", fmt_elapsed(elapsed_secs))
}

/// Prints the per-second lines until dropped. Lines go to stderr when stdout carries JSON.
pub(crate) struct Ticker {
    task: tokio::task::JoinHandle<()>,
}

impl Ticker {
    /// Starts printing (nothing at all with `quiet`).
    pub(crate) fn start(stats: Arc<Stats>, start: Instant, to_stderr: bool, quiet: bool) -> Ticker {
        let task = tokio::spawn(async move {
            if quiet {
                return;
            }
            let mut last = [0u64; Counter::ALL.len()];
            let mut last_at = start;
            let mut tick = tokio::time::interval_at(
                tokio::time::Instant::from_std(start) + Duration::from_secs(1),
                Duration::from_secs(1),
            );
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut out = String::new();
            loop {
                tick.tick().await;
                let now = Instant::now();
                let interval = now - last_at;
                last_at = now;
                let elapsed = (now - start).as_secs_f64().round() as u64;
                out.clear();
                for (i, c) in Counter::ALL.iter().enumerate() {
                    let total = stats.get(*c);
                    if total != last[i] {
                        let _ =
                            writeln!(out, "{}", line(elapsed, c.name(), total, total - last[i], interval));
                        last[i] = total;
                    }
                }
                if !out.is_empty() {
                    if to_stderr {
                        let _ = std::io::stderr().write_all(out.as_bytes());
                    } else {
                        let mut o = std::io::stdout().lock();
                        let _ = o.write_all(out.as_bytes());
                        let _ = o.flush();
                    }
                }
            }
        });
        Ticker { task }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Latency percentiles in nanoseconds.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub(crate) struct Latency {
    /// Samples.
    pub count: u64,
    /// Smallest.
    pub min: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 95th percentile.
    pub p95: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
}

impl Latency {
    /// Percentiles of `h` (all zero when empty).
    pub(crate) fn of(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            count: h.len(),
            min: h.min(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p95: h.value_at_quantile(0.95),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// The final summary of one run.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Summary {
    /// `conn`, `sub` or `pub`.
    pub mode: String,
    /// Protocol level (3, 4, 5).
    pub version: u8,
    /// Publishing clients.
    pub publishers: u64,
    /// Subscribing clients.
    pub subscribers: u64,
    /// Publish QoS (pub) or subscription QoS (sub).
    pub qos: u8,
    /// Payload bytes (pub).
    pub payload_size: usize,
    /// Topics per client from `--topics-payload` (0: plain `-t`).
    pub spec_topics: usize,
    /// Publisher in-flight window (QoS 1/2).
    pub inflight: u32,
    /// Receive Maximum the subscribers announced.
    pub receive_maximum: u16,
    /// Connections that got CONNACK.
    pub connect_succ: u64,
    /// Connections that failed.
    pub connect_fail: u64,
    /// Seconds from the first CONNECT to the last CONNACK.
    pub connect_secs: f64,
    /// Connections per second over that time.
    pub connect_rate: f64,
    /// CONNECT -> CONNACK times (ns).
    pub connect_latency_ns: Latency,
    /// Successful SUBSCRIBEs.
    pub sub: u64,
    /// Failed SUBSCRIBEs.
    pub sub_fail: u64,
    /// Publishes completed (QoS 0 written, QoS 1/2 acknowledged).
    pub published: u64,
    /// Publishes failed.
    pub pub_fail: u64,
    /// Seconds from the start of publishing to the last completed publish.
    pub pub_secs: f64,
    /// `published / pub_secs`.
    pub pub_rate: f64,
    /// Messages received (all subscribers; duplicates included).
    pub received: u64,
    /// Messages the subscribers should have received (pub with --sub: published x subscribers).
    pub expected: u64,
    /// Seconds from the start of publishing (or of the first message, for sub) to the last message.
    pub recv_secs: f64,
    /// `received / recv_secs`.
    pub recv_rate: f64,
    /// Messages never received.
    pub lost: u64,
    /// Messages received twice.
    pub duplicates: u64,
    /// Messages received after a later one of the same publisher.
    pub out_of_order: u64,
    /// Messages without a stamp (payload under 10 bytes, foreign publishers).
    pub unstamped: u64,
    /// End-to-end latency, publisher stamp to subscriber receive (ns).
    pub latency_ns: Latency,
    /// Connections lost during the run.
    pub disconnected: u64,
    /// conn: messages received on broadcast filters (-t without a variable).
    pub broadcast_received: u64,
    /// conn: their latency, publisher stamp to receive (ns); `max` is the time until the last
    /// client had one broadcast message.
    pub broadcast_latency_ns: Latency,
    /// conn: this process's resident memory once every client connected (bytes).
    pub tool_rss_bytes: u64,
    /// conn: `tool_rss_bytes` per connected client.
    pub tool_rss_per_conn_bytes: u64,
    /// conn: growth of resident memory from before the first connect, per connected client.
    pub tool_rss_added_per_conn_bytes: u64,
    /// conn: clients connected when the last reconnect storm started.
    pub storm_clients: u64,
    /// conn: of those, the clients back (connected and subscribed again).
    pub storm_back: u64,
    /// conn: seconds from the drop to the last client back.
    pub storm_secs: f64,
    /// Wall-clock seconds of the whole run.
    pub elapsed_secs: f64,
}

fn us(ns: u64) -> String {
    fmt_ns(ns as f64)
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2}s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2}ms", ns / 1e6)
    } else {
        format!("{:.1}µs", ns / 1e3)
    }
}

impl Summary {
    /// The summary as people read it.
    pub(crate) fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "== braid bench {} summary (MQTT v{}) ==", self.mode, version_name(self.version));
        let _ = writeln!(
            s,
            "connect: {} ok, {} failed in {:.2}s ({:.0}/sec), CONNACK p50 {} p99 {}",
            self.connect_succ,
            self.connect_fail,
            self.connect_secs,
            self.connect_rate,
            us(self.connect_latency_ns.p50),
            us(self.connect_latency_ns.p99)
        );
        if self.sub + self.sub_fail > 0 {
            let _ = writeln!(s, "subscribe: {} ok, {} failed", self.sub, self.sub_fail);
        }
        if self.mode == "pub" && self.spec_topics > 0 {
            let _ = writeln!(
                s,
                "publish: {} messages on {} topic-spec topics per client from {} clients in {:.2}s: {:.0} msg/sec ({} failed)",
                self.published, self.spec_topics, self.publishers, self.pub_secs, self.pub_rate, self.pub_fail
            );
        } else if self.mode == "pub" {
            let _ = writeln!(
                s,
                "publish: {} x QoS {} of {} B from {} clients in {:.2}s: {:.0} msg/sec ({} failed)",
                self.published,
                self.qos,
                self.payload_size,
                self.publishers,
                self.pub_secs,
                self.pub_rate,
                self.pub_fail
            );
        }
        if self.subscribers > 0 {
            let expected =
                if self.expected > 0 { format!(" of {} expected", self.expected) } else { String::new() };
            let _ = writeln!(
                s,
                "receive: {}{} by {} clients in {:.2}s: {:.0} msg/sec; lost {}, duplicated {}, out of order {}, unstamped {}",
                self.received,
                expected,
                self.subscribers,
                self.recv_secs,
                self.recv_rate,
                self.lost,
                self.duplicates,
                self.out_of_order,
                self.unstamped
            );
            let l = &self.latency_ns;
            if l.count > 0 {
                let _ = writeln!(
                    s,
                    "latency: min {} mean {} p50 {} p90 {} p99 {} p99.9 {} max {} ({} samples)",
                    us(l.min),
                    fmt_ns(l.mean),
                    us(l.p50),
                    us(l.p90),
                    us(l.p99),
                    us(l.p999),
                    us(l.max),
                    l.count
                );
            }
        }
        let b = &self.broadcast_latency_ns;
        if self.broadcast_received > 0 {
            let _ = writeln!(
                s,
                "broadcast: {} received, latency p50 {} p99 {} max {} ({} samples)",
                self.broadcast_received,
                us(b.p50),
                us(b.p99),
                us(b.max),
                b.count
            );
        }
        if self.mode == "conn" && self.subscribers == 0 && self.latency_ns.count > 0 {
            let l = &self.latency_ns;
            let _ = writeln!(
                s,
                "own topic: {} received, latency p50 {} p99 {} max {} ({} samples)",
                self.received - self.broadcast_received,
                us(l.p50),
                us(l.p99),
                us(l.max),
                l.count
            );
        }
        if self.storm_clients > 0 {
            let _ = writeln!(
                s,
                "reconnect storm: {} of {} clients back in {:.2}s",
                self.storm_back, self.storm_clients, self.storm_secs
            );
        }
        if self.tool_rss_bytes > 0 {
            let _ = writeln!(
                s,
                "tool memory: RSS {:.1} MiB once connected, {} B per connection ({} B above the start)",
                self.tool_rss_bytes as f64 / 1048576.0,
                self.tool_rss_per_conn_bytes,
                self.tool_rss_added_per_conn_bytes
            );
        }
        if self.disconnected > 0 {
            let _ = writeln!(s, "connections lost during the run: {}", self.disconnected);
        }
        let _ = writeln!(s, "elapsed: {:.2}s", self.elapsed_secs);
        s
    }

    /// The summary as one JSON object.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("summary serializes")
    }
}

fn version_name(v: u8) -> &'static str {
    match v {
        3 => "3.1",
        4 => "3.1.1",
        _ => "5",
    }
}

/// `n / secs`, 0 for an empty interval.
pub(crate) fn rate(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elapsed_like_emqtt_bench() {
        assert_eq!(fmt_elapsed(5), "5s");
        assert_eq!(fmt_elapsed(61), "1m1s");
        assert_eq!(fmt_elapsed(121), "2m1s");
        assert_eq!(fmt_elapsed(3723), "1h2m3s");
    }

    #[test]
    fn line_format_matches_the_blog() {
        let l = line(5, "pub", 48, 10, Duration::from_micros(1_003_009));
        assert_eq!(l, "5s pub total=48 rate=9.97/sec");
        assert_eq!(line(89, "recv", 888, 10, Duration::from_secs(1)), "1m29s recv total=888 rate=10.00/sec");
    }

    #[test]
    fn latency_from_histogram() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap();
        }
        let l = Latency::of(&h);
        assert_eq!(l.count, 1000);
        assert_eq!(l.min, 1000);
        assert!(l.p50.abs_diff(500_000) < 1_000);
        assert!(l.p99.abs_diff(990_000) < 1_000);
        assert!(l.p999.abs_diff(999_000) < 1_000);
        assert!(l.max.abs_diff(1_000_000) < 1_000);
        assert!((l.mean - 500_500.0).abs() < 1_000.0);
        assert_eq!(Latency::of(&Histogram::<u64>::new(3).unwrap()), Latency::default());
    }

    #[test]
    fn summary_renders_text_and_json() {
        let s = Summary {
            mode: "pub".into(),
            version: 5,
            publishers: 2,
            subscribers: 1,
            qos: 1,
            payload_size: 1024,
            published: 100,
            received: 100,
            expected: 100,
            recv_secs: 1.0,
            recv_rate: 100.0,
            latency_ns: Latency {
                count: 100,
                min: 20_000,
                p50: 45_000,
                p99: 2_500_000,
                ..Default::default()
            },
            ..Default::default()
        };
        let text = s.to_text();
        assert!(text.contains("receive: 100 of 100 expected by 1 clients"), "{text}");
        assert!(text.contains("p50 45.0µs"), "{text}");
        assert!(text.contains("p99 2.50ms"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
        assert_eq!(v["received"], 100);
        assert_eq!(v["lost"], 0);
        assert_eq!(v["latency_ns"]["p50"], 45_000);
        assert_eq!(rate(10, 0.0), 0.0);
        assert_eq!(rate(10, 2.0), 5.0);
    }
}
