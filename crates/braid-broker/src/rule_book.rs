//! The rules and sinks in force, in two layers: the configuration's `[[rules]]` and `[[sinks]]`
//! (changed by editing the file and reloading), and those made through the admin API (and
//! `braid ctl`), kept in `<store.data_dir>/rules.json` with the disk store so that they outlive a
//! restart. Names are unique across both layers; a rule of either layer may name a sink of
//! either. Every change is checked against both layers together, saved, and then put in force
//! at once ([`Broker::install_rules`]); a change that does not pass changes nothing.

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::broker::Broker;
use crate::config::{check_rules, ConfigError, RuleConfig, SinkConfig, StoreBackend};

/// Rules and the sinks they send to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuleSet {
    /// Rules, in the order they run.
    pub rules: Vec<RuleConfig>,
    /// Sinks.
    pub sinks: Vec<SinkConfig>,
}

/// Where a rule or sink is defined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The configuration file (or flags, or the environment): read-only through the API.
    File,
    /// The admin API.
    Api,
}

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    /// The rule or sink is not sound; names the field and the problem.
    #[error("{0}")]
    Invalid(String),
    /// No rule or sink has the name.
    #[error("{0}")]
    NotFound(String),
    /// The change conflicts with what exists (a name taken, a sink a rule names, a rule or
    /// sink of the configuration file).
    #[error("{0}")]
    Conflict(String),
    /// The change could not be saved: nothing changed.
    #[error("cannot save {path}: {source}")]
    Save {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// The two layers and where the API's is kept.
#[derive(Debug)]
pub struct RuleBook {
    broker: Arc<Broker>,
    /// `<store.data_dir>/rules.json`, with the disk store; with the memory store API changes
    /// last until the broker stops.
    saved: Option<PathBuf>,
    layers: Mutex<Layers>,
}

#[derive(Debug, Clone, Default)]
struct Layers {
    file: RuleSet,
    api: RuleSet,
}

impl Layers {
    /// Both layers, the file's first.
    fn combined(&self) -> RuleSet {
        let mut all = self.file.clone();
        all.rules.extend(self.api.rules.iter().cloned());
        all.sinks.extend(self.api.sinks.iter().cloned());
        all
    }
}

impl RuleBook {
    /// The book of `broker`: its configuration's rules and sinks, and those the API made before
    /// (from `rules.json`), put in force. The error names the file and the problem: a broker
    /// does not start on rules it cannot read.
    pub fn open(broker: Arc<Broker>) -> Result<Arc<RuleBook>, String> {
        let config = broker.config();
        let saved =
            (config.store.backend == StoreBackend::Disk).then(|| config.store.data_dir.join("rules.json"));
        let file = RuleSet { rules: config.rules.clone(), sinks: config.sinks.clone() };
        let api = match &saved {
            Some(path) if path.exists() => {
                let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
            }
            _ => RuleSet::default(),
        };
        let layers = Layers { file, api };
        let all = layers.combined();
        if !layers.api.rules.is_empty() || !layers.api.sinks.is_empty() {
            let place = saved.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
            check(&all).map_err(|e| format!("{place} (rules and sinks made through the API): {e}"))?;
            broker.install_rules(&all.rules, &all.sinks);
        }
        Ok(Arc::new(RuleBook { broker, saved, layers: Mutex::new(layers) }))
    }

    /// Every rule with where it is defined, in the order they run.
    pub fn rules(&self) -> Vec<(RuleConfig, Source)> {
        let layers = self.layers.lock();
        let file = layers.file.rules.iter().map(|r| (r.clone(), Source::File));
        file.chain(layers.api.rules.iter().map(|r| (r.clone(), Source::Api))).collect()
    }

    /// Every sink with where it is defined.
    pub fn sinks(&self) -> Vec<(SinkConfig, Source)> {
        let layers = self.layers.lock();
        let file = layers.file.sinks.iter().map(|s| (s.clone(), Source::File));
        file.chain(layers.api.sinks.iter().map(|s| (s.clone(), Source::Api))).collect()
    }

    /// Adds (`create`) or replaces the API's rule of `rule.name`.
    pub fn put_rule(&self, rule: RuleConfig, create: bool) -> Result<(), EditError> {
        self.edit(|layers| put(&mut layers.api.rules, &layers.file.rules, rule, create))
    }

    /// Deletes the API's rule `name`.
    pub fn delete_rule(&self, name: &str) -> Result<(), EditError> {
        self.edit(|layers| delete(&mut layers.api.rules, &layers.file.rules, name))
    }

    /// Adds (`create`) or replaces the API's sink of `sink.name`.
    pub fn put_sink(&self, sink: SinkConfig, create: bool) -> Result<(), EditError> {
        self.edit(|layers| put(&mut layers.api.sinks, &layers.file.sinks, sink, create))
    }

    /// Deletes the API's sink `name`, which no rule may name.
    pub fn delete_sink(&self, name: &str) -> Result<(), EditError> {
        self.edit(|layers| {
            let all = layers.combined();
            let naming: Vec<&str> = all
                .rules
                .iter()
                .filter(|r| r.actions.iter().any(|a| a == name))
                .map(|r| r.name.as_str())
                .collect();
            if !naming.is_empty() && layers.api.sinks.iter().any(|s| s.name == name) {
                return Err(EditError::Conflict(format!(
                    "sink {name:?} is named by rule(s) {naming:?}: change or delete them first"
                )));
            }
            delete(&mut layers.api.sinks, &layers.file.sinks, name)
        })
    }

    /// Puts the configuration file's `file` layer in force (a reload), with the API's.
    pub fn set_file(&self, file: RuleSet) -> Result<(), EditError> {
        self.edit(|layers| {
            layers.file = file;
            Ok(())
        })
    }

    /// Applies `change` to a copy of the layers, checks both together, saves the API's layer
    /// if it changed, and puts the result in force.
    fn edit(&self, change: impl FnOnce(&mut Layers) -> Result<(), EditError>) -> Result<(), EditError> {
        let mut layers = self.layers.lock();
        let mut next = layers.clone();
        change(&mut next)?;
        let all = next.combined();
        check(&all).map_err(EditError::Invalid)?;
        if next.api != layers.api {
            self.save(&next.api)?;
        }
        self.broker.install_rules(&all.rules, &all.sinks);
        *layers = next;
        Ok(())
    }

    /// Writes the API's layer to `rules.json` (a new file renamed over the old one).
    fn save(&self, api: &RuleSet) -> Result<(), EditError> {
        let Some(path) = &self.saved else { return Ok(()) };
        let failed = |source| EditError::Save { path: path.display().to_string(), source };
        let text = serde_json::to_string_pretty(api).map_err(|e| failed(std::io::Error::other(e)))?;
        let new = path.with_extension("json.new");
        std::fs::write(&new, text).map_err(failed)?;
        std::fs::rename(&new, path).map_err(failed)
    }
}

/// Checks a whole set; the error names the rule or sink by name (`rule "hot": sql: line 1...`).
fn check(all: &RuleSet) -> Result<(), String> {
    let rules: Vec<&str> = all.rules.iter().map(|r| r.name.as_str()).collect();
    let sinks: Vec<&str> = all.sinks.iter().map(|s| s.name.as_str()).collect();
    check_rules(&all.rules, &all.sinks).map_err(|e| match e {
        ConfigError::Key { key, problem } => {
            let named = [("rules", "rule", &rules), ("sinks", "sink", &sinks)].into_iter().find_map(
                |(list, what, names)| {
                    let (at, field) = key.strip_prefix(list)?.strip_prefix('[')?.split_once(']')?;
                    let name = names.get(at.parse::<usize>().ok()?)?;
                    Some(match field.strip_prefix('.') {
                        Some(field) => format!("{what} {name:?}: {field}: {problem}"),
                        None => format!("{what} {name:?}: {problem}"),
                    })
                },
            );
            named.unwrap_or(format!("{key}: {problem}"))
        }
        other => other.to_string(),
    })
}

/// A rule or a sink: what has a name in the book.
trait Named {
    /// `rule` or `sink`, for messages.
    const WHAT: &'static str;
    fn name(&self) -> &str;
}

impl Named for RuleConfig {
    const WHAT: &'static str = "rule";
    fn name(&self) -> &str {
        &self.name
    }
}

impl Named for SinkConfig {
    const WHAT: &'static str = "sink";
    fn name(&self) -> &str {
        &self.name
    }
}

/// A conflict if `file` has `name`: the API does not change what the file defines.
fn not_in_file<T: Named>(file: &[T], name: &str) -> Result<(), EditError> {
    match file.iter().any(|x| x.name() == name) {
        true => Err(EditError::Conflict(format!(
            "{} {name:?} is defined in the configuration file: change it there and reload",
            T::WHAT
        ))),
        false => Ok(()),
    }
}

/// Puts `item` in `api`: added when `create` (a name taken in either layer is a conflict),
/// else in place of the one with its name (not found, or a conflict when `file` has it).
fn put<T: Named>(api: &mut Vec<T>, file: &[T], item: T, create: bool) -> Result<(), EditError> {
    let name = item.name().to_string();
    not_in_file(file, &name)?;
    match (api.iter().position(|x| x.name() == name), create) {
        (Some(_), true) => Err(EditError::Conflict(format!("{} {name:?} exists: PUT changes it", T::WHAT))),
        (Some(at), false) => {
            api[at] = item;
            Ok(())
        }
        (None, true) => {
            api.push(item);
            Ok(())
        }
        (None, false) => Err(EditError::NotFound(format!("no {} named {name:?}", T::WHAT))),
    }
}

/// Deletes the item named `name` from `api` (not found, or a conflict when `file` has it).
fn delete<T: Named>(api: &mut Vec<T>, file: &[T], name: &str) -> Result<(), EditError> {
    not_in_file(file, name)?;
    let at = api.iter().position(|x| x.name() == name);
    let at = at.ok_or_else(|| EditError::NotFound(format!("no {} named {name:?}", T::WHAT)))?;
    api.remove(at);
    Ok(())
}
