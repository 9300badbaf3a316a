//! What the parts of a node other than the broker core (its bridges, its cluster membership)
//! report to operators. Each registers a [`Report`] with [`crate::Broker::add_report`]; the
//! HTTP admin listener lists their entries under `/api/v1/<collection>` and exports their
//! samples with the broker's own metrics.

/// A part of the node that operators watch.
pub trait Report: Send + Sync + std::fmt::Debug {
    /// The API collection its entries belong to: `"bridges"` or `"nodes"`.
    fn collection(&self) -> &'static str;
    /// Its entries, each a JSON object with a `"name"`.
    fn entries(&self) -> Vec<serde_json::Value>;
    /// Its metrics, appended to `out`.
    fn samples(&self, out: &mut Vec<Sample>);
    /// Its histograms, appended to `out` (none by default).
    fn histograms(&self, _out: &mut Vec<HistogramSample>) {}
}

/// One histogram of one metric, with its labels.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSample {
    /// The metric's name (`braid_` prefix, `_seconds`).
    pub name: &'static str,
    /// What it measures, one line.
    pub help: &'static str,
    /// Its labels, in order.
    pub labels: Vec<(&'static str, String)>,
    /// Its buckets, count and sum.
    pub value: HistogramSnapshot,
}

use crate::metrics::HistogramSnapshot;

/// One value of one metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The metric's name, in the Prometheus conventions (`braid_` prefix, `_total` counters,
    /// base units).
    pub name: &'static str,
    /// What it measures, one line.
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// Its labels, in order.
    pub labels: Vec<(&'static str, String)>,
    /// Its value.
    pub value: f64,
}

/// How a metric's value moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (until the process restarts).
    Counter,
    /// Goes up and down.
    Gauge,
}

impl Sample {
    /// A counter's value.
    pub fn counter(name: &'static str, help: &'static str, value: u64) -> Sample {
        Sample { name, help, kind: Kind::Counter, labels: Vec::new(), value: value as f64 }
    }

    /// A gauge's value.
    pub fn gauge(name: &'static str, help: &'static str, value: f64) -> Sample {
        Sample { name, help, kind: Kind::Gauge, labels: Vec::new(), value }
    }

    /// The same with one more label.
    pub fn with(mut self, label: &'static str, value: impl Into<String>) -> Sample {
        self.labels.push((label, value.into()));
        self
    }
}
