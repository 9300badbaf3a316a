//! Reloading the configuration on SIGHUP (`POST /api/v1/reload` raises one): the file, the
//! environment and the flags are read again. A configuration that does not load is refused
//! whole and the running one stays. Otherwise what can change live is put in force —
//! `[limits]` and `[session]` (for connections from now on; the connection limits and the
//! memory watermark at once), `log.level`, the bridges (each added, removed or changed
//! one started, stopped or restarted; the others go on undisturbed), and the rules and sinks
//! (the file's, beside those the API made: `braid_broker::rule_book`) — and every other changed
//! key is named as needing a restart. On the same signal the password and ACL files, the API keys and the TLS
//! certificates are read again by their owners.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::watch;
use tracing::{info, warn};
use tracing_subscriber::{reload, EnvFilter, Registry};

use braid_admin::Reloaded;
use braid_broker::rule_book::{RuleBook, RuleSet};
use braid_broker::{Broker, Config};

/// The keys (or sections, ending in `.`) a reload changes without a restart.
const LIVE: [&str; 6] = ["limits.", "session.", "log.level", "bridges.", "rules", "sinks"];

/// Reads the configuration again and applies what it can.
pub(crate) struct Reloader {
    file: Option<PathBuf>,
    overrides: Vec<String>,
    broker: Arc<Broker>,
    /// The rules and sinks in force: a reload puts the file's in force.
    book: Arc<RuleBook>,
    /// The log filter, unless `BRAID_LOG` sets it.
    log: Option<reload::Handle<EnvFilter, Registry>>,
    /// The configuration in force: the start's with the live keys of the last reload.
    running: Config,
    bridges: braid_bridge::Bridges,
    reports: watch::Sender<Reloaded>,
    /// SIGHUP, watched from the start (unwatched, it would end the process).
    hangup: Option<tokio::signal::unix::Signal>,
}

impl Reloader {
    /// A reloader for `broker`, started from `file` and `overrides` (as `braid serve` got
    /// them); it watches SIGHUP from now on (call within the runtime).
    pub(crate) fn new(
        file: Option<PathBuf>,
        overrides: Vec<String>,
        broker: Arc<Broker>,
        book: Arc<RuleBook>,
        log: Option<reload::Handle<EnvFilter, Registry>>,
        bridges: braid_bridge::Bridges,
    ) -> Reloader {
        let running = broker.config().clone();
        let reports = watch::Sender::new(Reloaded { seq: 0, outcome: Ok(Value::Null) });
        let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .inspect_err(|e| warn!("cannot watch SIGHUP: the configuration will not reload: {e}"))
            .ok();
        Reloader { file, overrides, broker, book, log, running, bridges, reports, hangup }
    }

    /// Where the outcome of each reload is announced (for the admin API).
    pub(crate) fn reports(&self) -> watch::Receiver<Reloaded> {
        self.reports.subscribe()
    }

    /// Reloads on every SIGHUP until the broker shuts down.
    pub(crate) async fn run(mut self) {
        let Some(mut hup) = self.hangup.take() else { return };
        loop {
            tokio::select! {
                got = hup.recv() => if got.is_none() { return },
                _ = self.broker.shutdown().cancelled() => return,
            }
            let outcome = self.reload().await;
            match &outcome {
                Ok(v) => {
                    info!(changed = %v["changed"], restart_needed = %v["restart_needed"], "SIGHUP: configuration reloaded")
                }
                Err(e) => warn!("SIGHUP: the new configuration is refused, the running one stays: {e}"),
            }
            self.reports.send_modify(|r| *r = Reloaded { seq: r.seq + 1, outcome });
        }
    }

    /// One reload: the changed keys applied live and those that need a restart, or why the
    /// new configuration was refused.
    async fn reload(&mut self) -> Result<Value, String> {
        self.broker.security().reload(true);
        let new = Config::load(self.file.as_deref(), &self.overrides).map_err(|e| e.to_string())?;
        braid_bridge::check(&new).map_err(|e| e.to_string())?;
        let (old_keys, new_keys) = (flatten(&self.running), flatten(&new));
        let changed: Vec<&String> = old_keys
            .keys()
            .chain(new_keys.keys().filter(|k| !old_keys.contains_key(*k)))
            .filter(|k| old_keys.get(*k) != new_keys.get(*k))
            .collect();
        let (live, restart): (Vec<&String>, Vec<&String>) =
            changed.into_iter().partition(|k| LIVE.iter().any(|l| k.starts_with(l) || k == l));
        let mut notes = Vec::new();
        if live.iter().any(|k| *k == "log.level") {
            match (&self.log, EnvFilter::try_new(&new.log.level)) {
                (Some(handle), Ok(filter)) => {
                    if let Err(e) = handle.reload(filter) {
                        notes.push(format!("log.level: {e}"));
                    }
                }
                (None, _) => notes.push("log.level: not applied, BRAID_LOG sets the log filter".to_string()),
                (_, Err(e)) => return Err(format!("log.level: {e}")),
            }
        }
        if live.iter().any(|k| *k == "rules" || *k == "sinks") {
            let file = RuleSet { rules: new.rules.clone(), sinks: new.sinks.clone() };
            self.book.set_file(file).map_err(|e| e.to_string())?;
        }
        self.broker.apply_live(&new);
        let bridges = match live.iter().any(|k| k.starts_with("bridges.")) {
            true => self.bridges.apply(&new.bridges).await,
            false => Vec::new(),
        };
        self.running.limits = new.limits.clone();
        self.running.session = new.session.clone();
        self.running.log.level = new.log.level.clone();
        self.running.bridges = new.bridges.clone();
        self.running.rules = new.rules.clone();
        self.running.sinks = new.sinks.clone();
        for key in &restart {
            warn!(key = %key, "changed in the configuration: takes effect at the next start");
        }
        Ok(json!({
            "changed": live,
            "bridges": bridges,
            "restart_needed": restart,
            "notes": notes,
            "reloaded_files": ["auth.password_file", "acl.file", "admin.api_keys_file", "tls certificates"],
        }))
    }
}

/// Every key of `config` as `section.key` (nested tables dotted, lists whole) -> its value.
fn flatten(config: &Config) -> BTreeMap<String, Value> {
    fn walk(prefix: &str, v: Value, out: &mut BTreeMap<String, Value>) {
        match v {
            Value::Object(map) => {
                for (k, x) in map {
                    walk(&if prefix.is_empty() { k } else { format!("{prefix}.{k}") }, x, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", serde_json::to_value(config).unwrap_or(Value::Null), &mut out);
    out
}
