//! `[[auto_subscribe]]`: subscriptions every client gets when it connects, as EMQX's
//! auto-subscribe makes them (see docs/mqtt.md).

use std::net::SocketAddr;

use braid_proto::topic::{parse_shared, valid_topic_filter};
use braid_proto::{QoS, RetainHandling, SubscriptionOptions};
use serde::{Deserialize, Serialize};

use super::ConfigError;

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

/// What the placeholders of a topic stand for, for one client.
#[derive(Debug, Clone, Copy)]
pub struct Client<'a> {
    /// Its client id.
    pub client_id: &'a str,
    /// Its user name, if it gave one.
    pub username: Option<&'a str>,
    /// Its address.
    pub peer: SocketAddr,
}

impl AutoSubscribeConfig {
    /// The filter for `client`; None if the topic names a user name the client did not give.
    pub fn filter_for(&self, client: Client<'_>) -> Option<String> {
        expand(&self.topic, |name| match name {
            "clientid" => Some(client.client_id.to_string()),
            "username" => client.username.map(str::to_string),
            "host" => Some(client.peer.ip().to_string()),
            "port" => Some(client.peer.port().to_string()),
            _ => None,
        })
    }

    /// The subscription's options.
    pub fn options(&self) -> SubscriptionOptions {
        SubscriptionOptions {
            qos: QoS::from_u8(self.qos).unwrap_or(QoS::AtMostOnce),
            no_local: self.nl,
            retain_as_published: self.rap,
            retain_handling: match self.rh {
                0 => RetainHandling::SendAtSubscribe,
                1 => RetainHandling::SendIfNew,
                _ => RetainHandling::DoNotSend,
            },
        }
    }

    /// Checks entry `at` (from 0); the error names the key and the problem.
    fn validate(&self, at: usize) -> Result<(), ConfigError> {
        let key = |field: &str| format!("auto_subscribe[{at}].{field}");
        if self.qos > 2 {
            return Err(ConfigError::invalid(key("qos"), format!("{}: 0, 1 or 2", self.qos)));
        }
        if self.rh > 2 {
            return Err(ConfigError::invalid(key("rh"), format!("{}: 0, 1 or 2", self.rh)));
        }
        let mut unknown = None;
        let sample = expand(&self.topic, |name| match name {
            "clientid" | "username" | "host" | "port" => Some("x".to_string()),
            other => {
                unknown = Some(other.to_string());
                None
            }
        });
        if let Some(name) = unknown {
            return Err(ConfigError::invalid(
                key("topic"),
                format!(
                    "${{{name}}}: not a placeholder (${{clientid}}, ${{username}}, ${{host}}, ${{port}})"
                ),
            ));
        }
        let valid = sample.as_deref().is_some_and(|f| match parse_shared(f) {
            Ok(None) => valid_topic_filter(f),
            Ok(Some(_)) => true,
            Err(_) => false,
        });
        if !valid {
            return Err(ConfigError::invalid(
                key("topic"),
                format!("{:?} is not a topic filter", self.topic),
            ));
        }
        Ok(())
    }
}

/// Every entry is sound.
pub(super) fn validate(entries: &[AutoSubscribeConfig]) -> Result<(), ConfigError> {
    entries.iter().enumerate().try_for_each(|(at, e)| e.validate(at))
}

/// `template` with each `${name}` replaced by `value(name)`; None if a value is missing (or a
/// `${` is not closed).
fn expand(template: &str, mut value: impl FnMut(&str) -> Option<String>) -> Option<String> {
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let end = rest[at..].find('}')? + at;
        out.push_str(&value(&rest[at + 2..end])?);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(topic: &str) -> AutoSubscribeConfig {
        AutoSubscribeConfig { topic: topic.into(), ..Default::default() }
    }

    #[test]
    fn a_topic_is_filled_in_for_each_client() {
        let client =
            Client { client_id: "dev1", username: Some("alice"), peer: "10.1.2.3:5555".parse().unwrap() };
        let topic = entry("c/${clientid}/${username}/${host}:${port}/#");
        assert_eq!(topic.filter_for(client).as_deref(), Some("c/dev1/alice/10.1.2.3:5555/#"));
        let anonymous = Client { username: None, ..client };
        assert_eq!(topic.filter_for(anonymous), None, "no user name: not subscribed");
        assert_eq!(entry("all/${clientid}").filter_for(anonymous).as_deref(), Some("all/dev1"));
    }

    #[test]
    fn a_bad_entry_names_its_key_and_the_problem() {
        let err = |e: AutoSubscribeConfig| validate(&[entry("ok"), e]).unwrap_err().to_string();
        let unknown = err(entry("a/${user}"));
        assert!(
            unknown.contains("auto_subscribe[1].topic") && unknown.contains("${user}: not a placeholder"),
            "{unknown}"
        );
        assert!(err(entry("a/#/b")).contains("not a topic filter"));
        assert!(err(AutoSubscribeConfig { qos: 3, ..entry("a") }).contains("auto_subscribe[1].qos"));
        assert!(err(AutoSubscribeConfig { rh: 5, ..entry("a") }).contains("auto_subscribe[1].rh"));
        assert!(validate(&[entry("$share/g/jobs/${clientid}")]).is_ok());
    }
}
