//! A configuration that could not be loaded: the key at fault, the problem and where the value came from.

use std::path::PathBuf;

use figment::Figment;

/// A configuration that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A key with a value of the wrong type, an unknown key, or a value out of range.
    #[error("{key}: {problem}")]
    Key {
        /// The key, as `section.key`.
        key: String,
        /// What is wrong with it, and where the value came from (unless it is a default).
        problem: String,
    },
    /// The configuration file does not exist or cannot be read.
    #[error("config file {}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// Why it cannot be read.
        #[source]
        source: std::io::Error,
    },
    /// A `--set` item without `=`.
    #[error("--set {item:?}: expected section.key=value")]
    SetSyntax {
        /// The item as given.
        item: String,
    },
    /// Input that does not parse, at no key (a TOML syntax error).
    #[error("{problem}")]
    Parse {
        /// What is wrong, with the line and where the input came from.
        problem: String,
    },
}

/// An [`ConfigError::invalid`] result, for the sections' checks.
pub(super) fn bad(key: &str, problem: &str) -> Result<(), ConfigError> {
    Err(ConfigError::invalid(key, problem))
}

impl ConfigError {
    /// `key` has a value that is not acceptable.
    pub fn invalid(key: impl Into<String>, problem: impl std::fmt::Display) -> ConfigError {
        ConfigError::Key { key: key.into(), problem: problem.to_string() }
    }

    /// The key at fault, as `section.key`, when there is one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Key { key, .. } => Some(key),
            _ => None,
        }
    }

    /// Figment's errors, the first one's key path as the key; further errors (there are
    /// several when more than one source fails) follow in the problem.
    pub(super) fn from_figment(err: figment::Error) -> ConfigError {
        let mut key = None;
        let mut problems = Vec::new();
        for e in err {
            let at = key_of(&e.path);
            let mut problem = describe(&e.kind, &e.path);
            if let Some(from) = e.metadata.as_ref().and_then(|m| origin(m, &e.path)) {
                problem = format!("{problem} (from {from})");
            }
            if key.is_none() {
                key = Some(at);
                problems.push(problem);
            } else if at.is_empty() {
                problems.push(problem);
            } else {
                problems.push(format!("{at}: {problem}"));
            }
        }
        let problem = problems.join("; ");
        match key {
            Some(key) if !key.is_empty() => ConfigError::Key { key, problem },
            _ => ConfigError::Parse { problem },
        }
    }

    /// A [`ConfigError::Key`] found on the merged configuration (by `validate`), with where
    /// the key's value came from, as figment's own errors say it; a default says nothing more.
    pub(super) fn with_origin(self, figment: &Figment) -> ConfigError {
        match self {
            ConfigError::Key { key, problem } => {
                // An item of a list (`sinks[0].url`) came from where the list came from.
                let path: Vec<&str> = key.split('.').collect();
                let list = key.split_once('[').map(|(list, _)| list);
                let metadata = figment.find_metadata(&key).or_else(|| figment.find_metadata(list?));
                let problem = match metadata.and_then(|m| origin(m, &path)) {
                    Some(from) => format!("{problem} (from {from})"),
                    None => problem,
                };
                ConfigError::Key { key, problem }
            }
            other => other,
        }
    }
}

/// The names errors give to the sources of values (see [`origin`]).
pub(super) const FROM_FILE: &str = "TOML file";
const FROM_ENV: &str = "environment variable";
pub(super) const FROM_FLAG: &str = "--set/--listen flag";

/// The environment's metadata: errors name the variable, `section.key` is `BRAID_SECTION_KEY`.
pub(super) fn env_metadata() -> figment::Metadata {
    figment::Metadata::named(FROM_ENV).interpolater(|_: &figment::Profile, keys: &[&str]| {
        format!("BRAID_{}", keys.join("_")).to_ascii_uppercase()
    })
}

/// Where the value at `path` came from, as `TOML file PATH`, `environment variable
/// BRAID_SECTION_KEY` or `--set/--listen flag`; `None` for a default.
pub(super) fn origin(metadata: &figment::Metadata, path: &[impl AsRef<str>]) -> Option<String> {
    match (metadata.name.as_ref(), &metadata.source) {
        (FROM_ENV, _) => {
            Some(format!("{FROM_ENV} {}", metadata.interpolate(&figment::Profile::Default, path)))
        }
        (name @ (FROM_FILE | FROM_FLAG), Some(source)) => Some(format!("{name} {source}")),
        (name @ (FROM_FILE | FROM_FLAG), None) => Some(name.to_string()),
        _ => None,
    }
}

/// A figment error's problem, in words: unknown keys and values get the closest known one
/// ("did you mean"), or the known ones listed (figment's own text nests backticks).
fn describe(kind: &figment::error::Kind, path: &[String]) -> String {
    use figment::error::Kind;
    match kind {
        Kind::UnknownField(found, known) => {
            // The path ends with the unknown key itself.
            let parent = match path.split_last() {
                Some((last, parent)) if last == found => parent,
                _ => path,
            };
            let full =
                |name: &str| parent.iter().map(String::as_str).chain([name]).collect::<Vec<_>>().join(".");
            let what = if parent.is_empty() { "section" } else { "key" };
            match closest(found, known) {
                Some(near) => format!("unknown {what}; did you mean {}?", full(near)),
                None if parent.is_empty() => {
                    format!("unknown section; the sections are {}", list(known, "and"))
                }
                None => format!("unknown key; the keys of {} are {}", parent.join("."), list(known, "and")),
            }
        }
        Kind::UnknownVariant(found, known) => match closest(found, known) {
            Some(near) => format!("unknown value {found:?}; did you mean {near}?"),
            None => format!("unknown value {found:?}; expected {}", list(known, "or")),
        },
        other => other.to_string(),
    }
}

/// `a, b and c` (or `a, b or c`, with `conjunction` "or").
fn list(items: &[&str], conjunction: &str) -> String {
    match items {
        [] => "none".into(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} {conjunction} {last}", init.join(", ")),
    }
}

/// The candidate nearest to `word` by Levenshtein distance (the fewest insertions, deletions
/// and substitutions), if it is near enough to be a typo: at most a third of the word's length
/// away (at least 1, at most 3).
pub(super) fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).clamp(1, 3);
    candidates
        .iter()
        .map(|c| (strsim::levenshtein(word, c), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// A figment path as keys are written in errors: `sinks[0].type`, not `sinks.0.type`.
fn key_of(path: &[String]) -> String {
    let mut key = String::new();
    for part in path {
        if part.bytes().all(|b| b.is_ascii_digit()) && !key.is_empty() {
            key.push_str(&format!("[{part}]"));
        } else {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(part);
        }
    }
    key
}
