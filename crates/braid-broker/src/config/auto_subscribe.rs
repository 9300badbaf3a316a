//! `[[auto_subscribe]]`: subscriptions every client gets when it connects, as EMQX's
//! auto-subscribe makes them (see docs/mqtt.md).

use braid_proto::topic::{parse_shared, valid_topic_filter};
use braid_proto::{QoS, RetainHandling, SubscriptionOptions};
use braid_rules::Template;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ConfigError;

/// The placeholders a topic may have.
const PLACEHOLDERS: [&str; 4] = ["clientid", "username", "host", "port"];

/// One subscription.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AutoSubscribeConfig {
    /// The filter, with `${clientid}`, `${username}`, `${host}` (the client's IP address) and
    /// `${port}` filled in per client.
    pub topic: String,
    /// The subscription's maximum QoS: 0, 1 or 2.
    pub qos: u8,
    /// No Local: the client's own messages are not delivered to it.
    pub nl: bool,
    /// Retain As Published: the RETAIN flag is kept on delivery.
    pub rap: bool,
    /// Retain Handling: 0 sends the retained messages at every connect, 1 only when the
    /// subscription is new, 2 never.
    pub rh: u8,
}

/// An entry, compiled: its topic template and the subscription's options.
#[derive(Debug)]
pub struct AutoSubscription {
    /// The filter, filled per client (`clientid`, `username`, `host`, `port`); a client that
    /// lacks one of its values (a user name) is not subscribed.
    pub topic: Template,
    /// The subscription's options.
    pub options: SubscriptionOptions,
}

impl AutoSubscribeConfig {
    /// Compiles entry `at` (from 0); the error names the key and the problem.
    pub fn compile(&self, at: usize) -> Result<AutoSubscription, ConfigError> {
        let key = |field: &str| format!("auto_subscribe[{at}].{field}");
        if self.qos > 2 {
            return Err(ConfigError::invalid(key("qos"), format!("{}: 0, 1 or 2", self.qos)));
        }
        if self.rh > 2 {
            return Err(ConfigError::invalid(key("rh"), format!("{}: 0, 1 or 2", self.rh)));
        }
        let topic = Template::parse(&self.topic).map_err(|e| ConfigError::invalid(key("topic"), e))?;
        if let Some(name) = topic.names().find(|n| !PLACEHOLDERS.contains(n)) {
            return Err(ConfigError::invalid(
                key("topic"),
                format!(
                    "${{{name}}}: not a placeholder (${{clientid}}, ${{username}}, ${{host}}, ${{port}})"
                ),
            ));
        }
        let sample: Map<String, Value> = PLACEHOLDERS.iter().map(|n| (n.to_string(), "x".into())).collect();
        let valid = topic.render_all(&sample).is_some_and(|f| match parse_shared(&f) {
            Ok(None) => valid_topic_filter(&f),
            Ok(Some(_)) => true,
            Err(_) => false,
        });
        if !valid {
            return Err(ConfigError::invalid(
                key("topic"),
                format!("{:?} is not a topic filter", self.topic),
            ));
        }
        let options = SubscriptionOptions {
            qos: QoS::from_u8(self.qos).unwrap_or(QoS::AtMostOnce),
            no_local: self.nl,
            retain_as_published: self.rap,
            retain_handling: match self.rh {
                0 => RetainHandling::SendAtSubscribe,
                1 => RetainHandling::SendIfNew,
                _ => RetainHandling::DoNotSend,
            },
        };
        Ok(AutoSubscription { topic, options })
    }
}

/// Every entry compiles.
pub(super) fn validate(entries: &[AutoSubscribeConfig]) -> Result<(), ConfigError> {
    entries.iter().enumerate().try_for_each(|(at, e)| e.compile(at).map(drop))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(topic: &str) -> AutoSubscribeConfig {
        AutoSubscribeConfig { topic: topic.into(), ..Default::default() }
    }

    #[test]
    fn a_topic_is_filled_in_for_each_client_that_has_its_values() {
        let topic = entry("c/${clientid}/${username}/${host}:${port}/#").compile(0).unwrap().topic;
        let mut client: Map<String, Value> =
            [("clientid", "dev1"), ("username", "alice"), ("host", "10.1.2.3"), ("port", "5555")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.into()))
                .collect();
        assert_eq!(topic.render_all(&client).as_deref(), Some("c/dev1/alice/10.1.2.3:5555/#"));
        client.remove("username");
        assert_eq!(topic.render_all(&client), None, "no user name: not subscribed");
    }

    #[test]
    fn a_bad_entry_names_its_key_and_the_problem() {
        let err = |e: AutoSubscribeConfig| validate(&[entry("ok"), e]).unwrap_err().to_string();
        let unknown = err(entry("a/${user}"));
        assert!(
            unknown.contains("auto_subscribe[1].topic") && unknown.contains("${user}: not a placeholder"),
            "{unknown}"
        );
        assert!(err(entry("a/${clientid")).contains("unclosed"));
        assert!(err(entry("a/#/b")).contains("not a topic filter"));
        assert!(err(AutoSubscribeConfig { qos: 3, ..entry("a") }).contains("auto_subscribe[1].qos"));
        assert!(err(AutoSubscribeConfig { rh: 5, ..entry("a") }).contains("auto_subscribe[1].rh"));
        assert!(validate(&[entry("$share/g/jobs/${clientid}")]).is_ok());
    }
}
