//! Broker configuration: one TOML file, `BRAID_<SECTION>_<KEY>` environment variables and
//! `--set section.key=value` overrides, merged in that order. Every key has a default, so the
//! broker runs with no file at all. Every key is documented in `docs/configuration.md`.

//!
//! Each section is defined, with its defaults and its own checks, in a file of its own; this
//! file merges the sources and checks what spans sections.

mod admin;
mod auto_subscribe;
mod bridges;
mod cluster;
mod error;
mod limits;
mod listeners;
mod mqtt;
mod rewrite;
mod rules;
mod runtime;
mod security;
mod sinks;
mod store;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::Path;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::{Figment, Provider};
use serde::{Deserialize, Serialize};

pub use admin::AdminConfig;
pub use auto_subscribe::{AutoSubscribeConfig, AutoSubscription};
pub use bridges::{BridgesConfig, KafkaAck, KafkaBridgeConfig, KafkaIn, KafkaOut, MqttBridgeConfig};
pub use cluster::{ClusterConfig, PartitionPolicy};
pub use error::ConfigError;
use error::{env_metadata, FROM_FILE, FROM_FLAG};
pub use limits::LimitsConfig;
pub use listeners::{ClientAuth, Listeners, QuicConfig, TlsConfig, TlsVersion};
pub use mqtt::{
    ListenerPolicies, MqttConfig, OverflowPolicy, Overlapping, QueuePolicy, RetainedConfig, SessionConfig,
    SharedConfig, SharedStrategy, SysConfig,
};
pub use rewrite::{DestPart, RewriteAction, RewriteConfig, RewriteRule};
pub use rules::RuleConfig;
pub use runtime::{LogConfig, RuntimeConfig};
pub use security::{AclConfig, AclPolicy, AuthConfig, DeniedPublish};
pub use sinks::{SinkAck, SinkConfig, SinkKind};
pub use store::{Durability, StoreBackend, StoreConfig};

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Network listeners.
    pub listeners: Listeners,
    /// Protocol limits and features.
    pub mqtt: MqttConfig,
    /// Session and queue settings.
    pub session: SessionConfig,
    /// Shared subscriptions.
    pub shared: SharedConfig,
    /// `$SYS` topics.
    pub sys: SysConfig,
    /// Limits on retained messages.
    pub retained: RetainedConfig,
    /// MQTT over QUIC.
    pub quic: QuicConfig,
    /// Logging.
    pub log: LogConfig,
    /// Authentication (see `docs/security.md`).
    pub auth: AuthConfig,
    /// Topic authorization rules.
    pub acl: AclConfig,
    /// Connection, rate, topic and memory limits.
    pub limits: LimitsConfig,
    /// Certificates for the TLS and WSS listeners.
    pub tls: TlsConfig,
    /// Persistence of sessions, queues and retained messages.
    pub store: StoreConfig,
    /// The threads that run connections.
    pub runtime: RuntimeConfig,
    /// Many nodes as one broker, on Redis (see `docs/cluster.md`).
    pub cluster: ClusterConfig,
    /// Bridges to other systems (see `docs/bridges.md`).
    pub bridges: BridgesConfig,
    /// The HTTP admin listener's authentication and limits (see `docs/api.md`).
    pub admin: AdminConfig,
    /// Rules run on what clients publish (`[[rules]]`, see `docs/rules.md`).
    pub rules: Vec<RuleConfig>,
    /// Where rules send their outputs (`[[sinks]]`, see `docs/rules.md`).
    pub sinks: Vec<SinkConfig>,
    /// Topic rewrite rules (`[[rewrite]]`, see `docs/mqtt.md`).
    pub rewrite: Vec<RewriteConfig>,
    /// Subscriptions every client gets at connect (`[[auto_subscribe]]`, see `docs/mqtt.md`).
    pub auto_subscribe: Vec<AutoSubscribeConfig>,
}

impl Config {
    /// Loads defaults, then `file` (if any), then `BRAID_*` environment variables, then
    /// `overrides` of the form `section.key=value` (value in TOML syntax; bare words are strings).
    pub fn load(file: Option<&Path>, overrides: &[String]) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|source| ConfigError::File { path: path.to_path_buf(), source })?;
            let metadata = figment::Metadata::from(FROM_FILE, path);
            figment = figment.merge(Named { provider: Toml::string(&text), metadata });
        }
        let sections = sections();
        let env = Env::prefixed("BRAID_").filter_map(move |key| {
            let key = key.as_str().to_ascii_lowercase();
            sections.iter().find_map(|section| {
                key.strip_prefix(section.as_str())
                    .and_then(|rest| rest.strip_prefix('_'))
                    .map(|rest| format!("{section}.{rest}").into())
            })
        });
        figment = figment.merge(Named { provider: env, metadata: env_metadata() });
        for item in overrides {
            let (key, value) =
                item.split_once('=').ok_or_else(|| ConfigError::SetSyntax { item: item.clone() })?;
            figment = figment.merge(Named {
                provider: Serialized::default(key.trim(), parse_value(value.trim())),
                metadata: figment::Metadata::named(FROM_FLAG),
            });
        }
        let config: Config = figment.extract().map_err(ConfigError::from_figment)?;
        config.validate().map_err(|e| e.with_origin(&figment))?;
        Ok(config)
    }

    /// Defaults for a broker embedded in a program or a test: MQTT over TCP and over QUIC (and
    /// the HTTP admin listener, for programs that serve it) on free loopback ports (see
    /// `Running::addr` and `Running::quic_addr`), no `$SYS` traffic, the memory store (nothing
    /// written to the working directory; set `store.backend` to `Disk` with a `data_dir` to
    /// persist).
    pub fn embedded() -> Config {
        let mut config = Config::default();
        config.listeners.tcp = SocketAddr::from(([127, 0, 0, 1], 0));
        config.listeners.quic = SocketAddr::from(([127, 0, 0, 1], 0));
        config.listeners.http = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        config.sys.interval_secs = 0;
        config.store.backend = StoreBackend::Memory;
        config
    }

    /// Each section's own checks, then those that span sections.
    fn validate(&self) -> Result<(), ConfigError> {
        self.mqtt.validate()?;
        self.session.validate()?;
        self.quic.validate()?;
        self.auth.validate()?;
        self.limits.validate()?;
        self.listeners.validate(&self.tls)?;
        self.tls.validate()?;
        self.store.validate()?;
        admin::validate(self)?;
        check_rules(&self.rules, &self.sinks)?;
        rewrite::validate(&self.rewrite)?;
        auto_subscribe::validate(&self.auto_subscribe)?;
        self.cluster.validate()
    }
}

/// Checks `rules` sending to `sinks`, as the configuration's `[[rules]]` and `[[sinks]]` are
/// checked: every sink is sound and every rule compiles, names only sinks among `sinks`, and no
/// two rules or sinks share a name. The error names the key (`rules[2].sql`) and the problem.
pub fn check_rules(rules: &[RuleConfig], sinks: &[SinkConfig]) -> Result<(), ConfigError> {
    sinks::validate(sinks)?;
    rules::validate(rules, sinks)
}

/// The configuration's sections, as `Config`'s fields are named (for `BRAID_<SECTION>_<KEY>`).
fn sections() -> Vec<String> {
    let defaults = Serialized::defaults(Config::default()).data().unwrap_or_default();
    defaults.into_values().flat_map(|dict| dict.into_keys()).collect()
}

/// A `--set` value: TOML syntax when it parses as such, else the raw text as a string.
fn parse_value(text: &str) -> toml::Value {
    format!("v = {text}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_string()))
}

/// A figment provider under the name errors give as the value's source (see [`origin`]): the
/// config file (read here, so that a missing one is a [`ConfigError::File`]), the environment
/// or a `--set` flag.
struct Named<P> {
    provider: P,
    metadata: figment::Metadata,
}

impl<P: figment::Provider> figment::Provider for Named<P> {
    fn metadata(&self) -> figment::Metadata {
        self.metadata.clone()
    }

    fn data(&self) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        self.provider.data()
    }
}

/// Accepts one string or a list of strings.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}
