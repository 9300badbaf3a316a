//! `GET /metrics`: the broker's counters, its store's, and those of every registered
//! [`braid_broker::report::Report`] (bridges, the cluster), in the Prometheus text format.
//! Read from relaxed atomics and one pass over the sessions (each session's lock taken once,
//! briefly, as one delivery to it does): a scrape takes no broker-wide lock that the publish
//! path takes per message.

use std::fmt::Write;
use std::time::Instant;

use braid_broker::metrics::Metrics;
use braid_broker::report::{HistogramSample, Kind, Sample};
use braid_broker::store::StoreStats;
use braid_broker::transport::Transport;
use braid_broker::Broker;
use braid_proto::QoS;

/// The broker's own samples.
fn broker_samples(broker: &Broker, store: &StoreStats) -> Vec<Sample> {
    let m = &broker.metrics();
    let mut out = Vec::new();
    let c = Sample::counter;
    let g = Sample::gauge;
    out.push(
        g("braid_build_info", "The running version (always 1).", 1.0)
            .with("version", env!("CARGO_PKG_VERSION")),
    );
    out.push(g(
        "braid_uptime_seconds",
        "Seconds since the broker started.",
        broker.started().elapsed().as_secs_f64(),
    ));
    out.push(g(
        "braid_clients_connected_max",
        "Most clients connected at once.",
        Metrics::get(&m.clients_maximum) as f64,
    ));
    out.push(g(
        "braid_clients_parked",
        "Idle connections parked (no task, no buffers).",
        broker.parked() as f64,
    ));
    for t in Transport::ALL {
        out.push(
            g(
                "braid_clients_connected",
                "Clients connected now, by listener.",
                Metrics::get(m.connected_by_transport.get(t)) as f64,
            )
            .with("transport", t.name()),
        );
    }
    let in_process = Metrics::get(&m.clients_connected)
        .saturating_sub(Transport::ALL.iter().map(|t| Metrics::get(m.connected_by_transport.get(*t))).sum());
    out.push(
        g("braid_clients_connected", "Clients connected now, by listener.", in_process as f64)
            .with("transport", "in_process"),
    );
    for t in Transport::ALL {
        out.push(
            c(
                "braid_connections_accepted_total",
                "CONNECTs accepted, by listener.",
                Metrics::get(m.connections_accepted.get(t)),
            )
            .with("transport", t.name()),
        );
    }
    let refused =
        "Connections refused: at accept (max_connections, out of file descriptors) or by CONNACK reason.";
    for (reason, counter) in
        [("max_connections", &m.connections_refused), ("out_of_file_descriptors", &m.connections_refused_fd)]
    {
        out.push(c("braid_connections_refused_total", refused, Metrics::get(counter)).with("reason", reason));
    }
    for (reason, n) in m.connects_refused.counted() {
        out.push(
            c("braid_connections_refused_total", refused, n).with("reason", snake(reason.description())),
        );
    }
    for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
        let q = (qos as u8).to_string();
        out.push(
            c(
                "braid_messages_received_total",
                "PUBLISH packets received from clients, by QoS.",
                m.messages_received.get(qos),
            )
            .with("qos", q.clone()),
        );
        out.push(
            c(
                "braid_messages_sent_total",
                "PUBLISH packets sent to clients, by QoS.",
                m.messages_sent.get(qos),
            )
            .with("qos", q),
        );
    }
    let dropped = "Messages dropped, by reason.";
    for (reason, counter) in [
        ("queue_full", &m.dropped_queue_full),
        ("expired", &m.dropped_expired),
        ("too_large", &m.dropped_too_large),
        ("not_authorized", &m.publishes_denied),
    ] {
        out.push(c("braid_messages_dropped_total", dropped, Metrics::get(counter)).with("reason", reason));
    }
    out.push(c(
        "braid_retained_refused_total",
        "Retained publishes over a [retained] limit (v5: refused with 0x97; 3.1.x: sent, not retained).",
        Metrics::get(&m.retained_refused),
    ));
    out.push(c(
        "braid_publishes_held_total",
        "Publishes whose acknowledgement a full subscriber queue held back.",
        Metrics::get(&m.publishes_held),
    ));
    out.push(c("braid_received_bytes_total", "Bytes read from clients.", Metrics::get(&m.bytes_received)));
    out.push(c("braid_sent_bytes_total", "Bytes written to clients.", Metrics::get(&m.bytes_sent)));
    let (sessions, subscriptions, retained) = broker.counts();
    out.push(g("braid_sessions", "Sessions held (connected or not).", sessions as f64));
    out.push(g("braid_subscriptions", "Subscriptions (filters in the router).", subscriptions as f64));
    out.push(g("braid_retained_messages", "Retained messages.", retained as f64));
    let totals = broker.operators().queue_totals();
    out.push(g(
        "braid_queued_messages",
        "Deliveries waiting to be sent, over every session.",
        totals.queued as f64,
    ));
    out.push(g(
        "braid_inflight_messages",
        "Deliveries sent and not yet acknowledged.",
        totals.inflight as f64,
    ));
    out.push(g(
        "braid_publishers_held",
        "Publishers held back by full queues now.",
        totals.publishers_held as f64,
    ));
    out.push(g(
        "braid_memory_alarm",
        "1 while memory is above limits.memory_high_watermark.",
        f64::from(u8::from(broker.memory().is_raised())),
    ));
    if let Some(rss) = braid_broker::limits::resident_memory() {
        out.push(g("braid_resident_memory_bytes", "Resident set size of the process.", rss as f64));
    }
    if let Some(bytes) = store.disk_bytes {
        out.push(g("braid_store_disk_bytes", "Bytes of the store's files on disk.", bytes as f64));
    }
    out
}

/// The whole exposition: the broker's samples, its store's fsync histogram, the reports'.
pub(crate) fn render(broker: &Broker, started: Instant) -> String {
    let store = broker.store().stats();
    let mut samples = broker_samples(broker, &store);
    let mut histograms = Vec::new();
    for report in broker.operators().reports() {
        report.samples(&mut samples);
        report.histograms(&mut histograms);
    }
    for r in broker.rules().reports() {
        let counted = [
            ("braid_rule_matched_total", "Messages a rule selected (FROM matched, WHERE held).", r.matched),
            ("braid_rule_passed_total", "Messages a rule selected that every action took.", r.passed),
            ("braid_rule_failed_total", "Messages a rule selected that an action failed on.", r.failed),
        ];
        for (name, help, value) in counted {
            samples.push(Sample::counter(name, help, value).with("rule", r.config.name.clone()));
        }
    }
    let mut text = String::with_capacity(8 * 1024);
    write_samples(&mut text, &samples);
    if let Some(syncs) = &store.syncs {
        histograms.push(HistogramSample {
            name: "braid_store_fsync_seconds",
            help: "How long the store's disk syncs took.",
            labels: Vec::new(),
            value: syncs.clone(),
        });
    }
    write_histograms(&mut text, &histograms);
    let _ = writeln!(
        text,
        "# HELP braid_scrape_duration_seconds How long this scrape took to gather.\n# TYPE braid_scrape_duration_seconds gauge\nbraid_scrape_duration_seconds {}",
        started.elapsed().as_secs_f64()
    );
    text
}

/// `items` grouped by `name_of`, the groups in the order their names first appear.
fn by_name<T>(items: &[T], name_of: impl Fn(&T) -> &'static str) -> Vec<(&'static str, Vec<&T>)> {
    let mut groups: Vec<(&'static str, Vec<&T>)> = Vec::new();
    for item in items {
        let name = name_of(item);
        match groups.iter_mut().find(|(n, _)| *n == name) {
            Some((_, group)) => group.push(item),
            None => groups.push((name, vec![item])),
        }
    }
    groups
}

/// Writes `samples`, grouped by name (each name's HELP and TYPE once, before its first sample).
fn write_samples(text: &mut String, samples: &[Sample]) {
    for (name, of) in by_name(samples, |s| s.name) {
        let kind = match of[0].kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = writeln!(text, "# HELP {name} {}\n# TYPE {name} {kind}", of[0].help);
        for s in of {
            let _ = writeln!(text, "{name}{} {}", labels(&s.labels), number(s.value));
        }
    }
}

/// Writes `histograms`, grouped by name (each name's HELP and TYPE once).
fn write_histograms(text: &mut String, histograms: &[HistogramSample]) {
    for (name, of) in by_name(histograms, |h| h.name) {
        let _ = writeln!(text, "# HELP {name} {}\n# TYPE {name} histogram", of[0].help);
        for h in of {
            let with = |le: &str| {
                let mut all = h.labels.clone();
                all.push(("le", le.to_string()));
                labels(&all)
            };
            for (le, n) in &h.value.buckets {
                let _ = writeln!(text, "{name}_bucket{} {n}", with(&le.to_string()));
            }
            let _ = writeln!(text, "{name}_bucket{} {}", with("+Inf"), h.value.count);
            let _ = writeln!(text, "{name}_sum{} {}", labels(&h.labels), number(h.value.sum_secs));
            let _ = writeln!(text, "{name}_count{} {}", labels(&h.labels), h.value.count);
        }
    }
}

fn labels(labels: &[(&'static str, String)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
    format!("{{{}}}", inner.join(","))
}

/// A label value escaped as the text format asks (backslash, quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// A reason's description as a label value: "Bad User Name or Password" -> "bad_user_name_or_password".
pub(crate) fn snake(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
        .collect::<String>()
        .split('_')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_grouped_under_one_help_and_type_with_escaped_labels() {
        let samples = vec![
            Sample::counter("braid_x_total", "X.", 1).with("a", "q\"uote"),
            Sample::gauge("braid_y", "Y.", 0.5),
            Sample::counter("braid_x_total", "X.", 2).with("a", "b"),
        ];
        let mut text = String::new();
        write_samples(&mut text, &samples);
        assert_eq!(
            text,
            "# HELP braid_x_total X.\n# TYPE braid_x_total counter\nbraid_x_total{a=\"q\\\"uote\"} 1\nbraid_x_total{a=\"b\"} 2\n\
             # HELP braid_y Y.\n# TYPE braid_y gauge\nbraid_y 0.5\n"
        );
        assert_eq!(snake("Bad User Name or Password"), "bad_user_name_or_password");
    }
}
