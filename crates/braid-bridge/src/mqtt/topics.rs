//! Mosquitto's `topic` lines: `pattern [[[ out | in | both ] qos] local-prefix remote-prefix]`,
//! parsed and checked, and the topic mapping they define in each direction.
//!
//! `out`: the bridge subscribes in Braid to local-prefix + pattern, and a message on topic T is
//! published on the remote at remote-prefix + (T without local-prefix). `in`: the bridge
//! subscribes on the remote to remote-prefix + pattern, and a message on T is published in
//! Braid at local-prefix + (T without remote-prefix). `""` stands for an empty pattern or
//! prefix; an empty pattern makes the two prefixes whole topics (one topic renamed).

use braid_client::QoS;
use braid_proto::topic::{matches, valid_topic_filter, valid_topic_name};

/// Which way a line bridges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Braid to the remote.
    Out,
    /// The remote to Braid.
    In,
    /// Both ways.
    Both,
}

/// One `topic` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line {
    pub pattern: String,
    pub direction: Direction,
    pub qos: QoS,
    pub local_prefix: String,
    pub remote_prefix: String,
}

/// Mosquitto's marker for an empty pattern or prefix.
const EMPTY: &str = "\"\"";

fn token(t: &str) -> String {
    if t == EMPTY {
        String::new()
    } else {
        t.to_string()
    }
}

impl Line {
    /// Parses and checks a line; the error says what is wrong with it.
    pub(crate) fn parse(text: &str) -> Result<Line, String> {
        let tokens: Vec<&str> = text.split_whitespace().collect();
        let usage = "expected `pattern [[[out|in|both] qos] local-prefix remote-prefix]`";
        if !matches!(tokens.len(), 1..=3 | 5) {
            return Err(format!("{text:?}: {usage}, \"\" for an empty pattern or prefix"));
        }
        let direction = match tokens.get(1).copied().unwrap_or("out") {
            "out" => Direction::Out,
            "in" => Direction::In,
            "both" => Direction::Both,
            other => return Err(format!("{text:?}: unknown direction {other:?} (out, in or both)")),
        };
        let qos = match tokens.get(2).copied().unwrap_or("0") {
            "0" => QoS::AtMostOnce,
            "1" => QoS::AtLeastOnce,
            "2" => QoS::ExactlyOnce,
            other => return Err(format!("{text:?}: QoS {other:?} is not 0, 1 or 2")),
        };
        let (local_prefix, remote_prefix) = match tokens.len() {
            5 => (token(tokens[3]), token(tokens[4])),
            _ => (String::new(), String::new()),
        };
        let line = Line { pattern: token(tokens[0]), direction, qos, local_prefix, remote_prefix };
        line.check().map_err(|why| format!("{text:?}: {why}"))?;
        Ok(line)
    }

    fn check(&self) -> Result<(), String> {
        let wild = |s: &str| s.contains(['+', '#']);
        if self.pattern.is_empty() {
            // One topic renamed: both prefixes are whole topic names.
            if self.local_prefix.is_empty() || self.remote_prefix.is_empty() {
                return Err("an empty pattern needs a local and a remote topic as prefixes".into());
            }
            for p in [&self.local_prefix, &self.remote_prefix] {
                if !valid_topic_name(p) {
                    return Err(format!(
                        "{p:?} is not a topic name (an empty pattern makes the prefixes whole topics)"
                    ));
                }
            }
            return Ok(());
        }
        if !valid_topic_filter(&self.pattern) {
            return Err(format!("the pattern {:?} is not an MQTT topic filter", self.pattern));
        }
        if self.pattern.starts_with("$share/") || self.pattern.starts_with("$queue/") {
            return Err(format!("the pattern {:?} is a shared subscription", self.pattern));
        }
        for (what, p) in [("local", &self.local_prefix), ("remote", &self.remote_prefix)] {
            if wild(p) {
                return Err(format!("the {what} prefix {p:?} has a wildcard"));
            }
            let filter = format!("{p}{}", self.pattern);
            if !valid_topic_filter(&filter) {
                return Err(format!(
                    "the {what} prefix {p:?} and the pattern make {filter:?}, not a topic filter"
                ));
            }
        }
        Ok(())
    }

    /// True if the line bridges Braid's messages to the remote.
    pub(crate) fn outgoing(&self) -> bool {
        self.direction != Direction::In
    }

    /// True if the line brings the remote's messages into Braid.
    pub(crate) fn incoming(&self) -> bool {
        self.direction != Direction::Out
    }

    /// What the bridge subscribes to in Braid (`out`).
    pub(crate) fn local_filter(&self) -> String {
        format!("{}{}", self.local_prefix, self.pattern)
    }

    /// What the bridge subscribes to on the remote (`in`).
    pub(crate) fn remote_filter(&self) -> String {
        format!("{}{}", self.remote_prefix, self.pattern)
    }

    /// The remote topic of a message published in Braid on `topic`, if the line takes it.
    pub(crate) fn to_remote(&self, topic: &str) -> Option<String> {
        map(topic, &self.pattern, &self.local_prefix, &self.remote_prefix)
    }

    /// The Braid topic of a message the remote published on `topic`, if the line takes it.
    pub(crate) fn to_local(&self, topic: &str) -> Option<String> {
        map(topic, &self.pattern, &self.remote_prefix, &self.local_prefix)
    }
}

/// `topic` under `from` + `pattern`, moved under `to`.
fn map(topic: &str, pattern: &str, from: &str, to: &str) -> Option<String> {
    if pattern.is_empty() {
        return (topic == from).then(|| to.to_string());
    }
    if !matches(&format!("{from}{pattern}"), topic) {
        return None;
    }
    let mapped = format!("{to}{}", topic.strip_prefix(from)?);
    valid_topic_name(&mapped).then_some(mapped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(s: &str) -> Line {
        Line::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn defaults_are_out_and_qos_0() {
        let l = line("a/#");
        assert_eq!((l.direction, l.qos), (Direction::Out, QoS::AtMostOnce));
        assert_eq!((l.local_prefix.as_str(), l.remote_prefix.as_str()), ("", ""));
        let l = line("a/+  in");
        assert_eq!((l.direction, l.qos), (Direction::In, QoS::AtMostOnce));
        let l = line("a both 2");
        assert_eq!((l.direction, l.qos), (Direction::Both, QoS::ExactlyOnce));
    }

    #[test]
    fn prefixes_remap_each_way() {
        let l = line("sensors/# out 1 local/ remote/");
        assert_eq!(l.local_filter(), "local/sensors/#");
        assert_eq!(l.remote_filter(), "remote/sensors/#");
        assert_eq!(l.to_remote("local/sensors/a/b").as_deref(), Some("remote/sensors/a/b"));
        assert_eq!(l.to_remote("sensors/a"), None);
        assert_eq!(l.to_local("remote/sensors/x").as_deref(), Some("local/sensors/x"));
        // Mosquitto's table: one side's prefix empty.
        let l = line("t/# both 0 L/ \"\"");
        assert_eq!(l.to_remote("L/t/1").as_deref(), Some("t/1"));
        assert_eq!(l.to_local("t/1").as_deref(), Some("L/t/1"));
        let l = line("t/# in 0 \"\" R/");
        assert_eq!(l.to_local("R/t/1").as_deref(), Some("t/1"));
        // `#` matches its parent level too, which no prefix can be taken from.
        let l = line("# out 0 a/ b/");
        assert_eq!(l.to_remote("a"), None);
        assert_eq!(l.to_remote("a/x").as_deref(), Some("b/x"));
    }

    #[test]
    fn an_empty_pattern_renames_one_topic() {
        let l = line("\"\" out 1 here/state there/status");
        assert_eq!(l.local_filter(), "here/state");
        assert_eq!(l.to_remote("here/state").as_deref(), Some("there/status"));
        assert_eq!(l.to_remote("here/state/x"), None);
        assert_eq!(l.to_local("there/status").as_deref(), Some("here/state"));
        assert_eq!(
            line("clients/total in 0 test/ $SYS/broker/").remote_filter(),
            "$SYS/broker/clients/total"
        );
    }

    #[test]
    fn bad_lines_say_why() {
        for (text, why) in [
            ("", "expected"),
            ("a out 1 x/", "expected"),
            ("a sideways", "unknown direction"),
            ("a out 3", "QoS"),
            ("a/#/b", "not an MQTT topic filter"),
            ("a out 0 x/+/ y/", "wildcard"),
            ("a out 0 x/ y/#", "wildcard"),
            ("\"\" out 0 x \"\"", "empty pattern"),
            ("\"\" out 0 x/+ y", "not a topic name"),
            ("\"\"", "empty pattern"),
            ("$share/g/a in 1", "shared"),
        ] {
            let e = Line::parse(text).expect_err(text);
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
