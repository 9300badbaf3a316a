//! The emqtt_bench topic spec (`--topics-payload spec.json`): several topics per publishing client,
//! each with its own interval, QoS, JSON payload, optional timestamp injection and `render`
//! templating (`%i` client sequence, `%c` client id, `%u` username, `%pN` N pages of 4 KiB).
//!
//! ```json
//! {"topics": [{"name": "Topic1", "interval_ms": "100", "inject_timestamp": true, "QoS": 1,
//!              "payload_encoding": "json", "payload": {"foo": "bar", "timestamp": "0", "Data": "%p2"},
//!              "stream": 0, "stream_priority": 200, "render": "Data"}]}
//! ```
//!
//! `stream` and `stream_priority` select and rank a QUIC stream (`--quic`: one data stream per
//! `stream` number, 0 being the control stream). Over TCP there is only the one byte stream, so
//! they are accepted and ignored (the caller warns once). Trailing commas, as in
//! the EMQX blog's example, are tolerated.

use serde_json::{Map, Value};

/// One page of `%pN` padding.
pub(crate) const PAGE: usize = 4096;

/// Unit of an injected timestamp (`inject_timestamp`: `true` = ns, or "s", "ms", "us", "ns").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TsUnit {
    /// Seconds since the Unix epoch.
    S,
    /// Milliseconds.
    Ms,
    /// Microseconds.
    Us,
    /// Nanoseconds.
    Ns,
}

impl TsUnit {
    /// Formats `epoch_ns` in this unit.
    pub(crate) fn scale(self, epoch_ns: u64) -> u64 {
        match self {
            TsUnit::S => epoch_ns / 1_000_000_000,
            TsUnit::Ms => epoch_ns / 1_000_000,
            TsUnit::Us => epoch_ns / 1_000,
            TsUnit::Ns => epoch_ns,
        }
    }
}

/// One topic of the spec.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TopicEntry {
    /// Topic name template (`%i`, `%c`, `%u`).
    pub name: String,
    /// Milliseconds between two messages on this topic, per client.
    pub interval_ms: u64,
    /// QoS 0..=2.
    pub qos: u8,
    /// Retain flag (`"retain": true`).
    pub retain: bool,
    /// Write the current time into the payload's `"timestamp"` field.
    pub inject_timestamp: Option<TsUnit>,
    /// The payload object (or a string, sent as is).
    pub payload: Value,
    /// `"json"` or `"eterm"`; both are sent as JSON here.
    pub payload_encoding: String,
    /// Name of the payload field whose value is rendered (`%pN`, `%i`, `%c`, `%u`).
    pub render: Option<String>,
    /// QUIC stream (0 = the control stream, the only one on TCP).
    pub stream: u64,
    /// QUIC stream priority (higher is more important).
    pub stream_priority: Option<i64>,
}

/// A parsed topic spec.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TopicSpec {
    /// The topics, in file order.
    pub topics: Vec<TopicEntry>,
}

impl TopicSpec {
    /// Parses the spec text.
    pub(crate) fn parse(text: &str) -> Result<TopicSpec, String> {
        let cleaned = strip_trailing_commas(text);
        let root: Value = serde_json::from_str(&cleaned).map_err(|e| format!("topic spec: {e}"))?;
        let topics = root
            .get("topics")
            .and_then(Value::as_array)
            .ok_or("topic spec: expected an object with a \"topics\" array")?;
        if topics.is_empty() {
            return Err("topic spec: \"topics\" is empty".into());
        }
        let mut out = Vec::with_capacity(topics.len());
        for (n, t) in topics.iter().enumerate() {
            out.push(parse_entry(t).map_err(|e| format!("topic spec: topics[{n}]: {e}"))?);
        }
        Ok(TopicSpec { topics: out })
    }

    /// True when some topic asks for a stream other than 0 or for a priority: ignored on TCP.
    pub(crate) fn uses_streams(&self) -> bool {
        self.topics.iter().any(|t| t.stream != 0 || t.stream_priority.is_some())
    }
}

fn parse_entry(v: &Value) -> Result<TopicEntry, String> {
    let obj = v.as_object().ok_or("expected an object")?;
    let name = obj.get("name").and_then(Value::as_str).ok_or("\"name\" (string) is required")?.to_string();
    if name.is_empty() {
        return Err("\"name\" is empty".into());
    }
    let interval_ms = match obj.get("interval_ms") {
        None => 1000,
        Some(v) => {
            int_of(v).ok_or("\"interval_ms\" must be a non-negative integer or a string holding one")?
        }
    };
    let qos = match obj.get("QoS").or_else(|| obj.get("qos")) {
        None => 0,
        Some(v) => match int_of(v) {
            Some(q @ 0..=2) => q as u8,
            _ => return Err("\"QoS\" must be 0, 1 or 2".into()),
        },
    };
    let retain = matches!(obj.get("retain"), Some(Value::Bool(true)));
    let inject_timestamp = match obj.get("inject_timestamp") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(TsUnit::Ns),
        Some(Value::String(s)) => match s.as_str() {
            "s" => Some(TsUnit::S),
            "ms" => Some(TsUnit::Ms),
            "us" | "µs" => Some(TsUnit::Us),
            "ns" | "true" => Some(TsUnit::Ns),
            "false" | "" => None,
            other => {
                return Err(format!(
                    "\"inject_timestamp\": unknown unit {other:?} (true, \"s\", \"ms\", \"us\", \"ns\")"
                ))
            }
        },
        Some(_) => return Err("\"inject_timestamp\" must be a boolean or a unit string".into()),
    };
    Ok(TopicEntry { inject_timestamp, ..parse_entry_rest(obj, name, interval_ms, qos, retain)? })
}

fn parse_entry_rest(
    obj: &Map<String, Value>,
    name: String,
    interval_ms: u64,
    qos: u8,
    retain: bool,
) -> Result<TopicEntry, String> {
    let payload = obj.get("payload").cloned().unwrap_or_else(|| Value::Object(Map::new()));
    if !payload.is_object() && !payload.is_string() {
        return Err("\"payload\" must be an object or a string".into());
    }
    let payload_encoding = match obj.get("payload_encoding") {
        None => "json".to_string(),
        Some(Value::String(s)) if s == "json" || s == "eterm" => s.clone(),
        Some(_) => return Err("\"payload_encoding\" must be \"json\" or \"eterm\"".into()),
    };
    let render = match obj.get("render") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("\"render\" must be a field name".into()),
    };
    let stream = match obj.get("stream") {
        None => 0,
        Some(v) => int_of(v).ok_or("\"stream\" must be a non-negative integer")?,
    };
    let stream_priority = match obj.get("stream_priority") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_i64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
                .ok_or("\"stream_priority\" must be an integer")?,
        ),
    };
    Ok(TopicEntry {
        name,
        interval_ms,
        qos,
        retain,
        inject_timestamp: None,
        payload,
        payload_encoding,
        render,
        stream,
        stream_priority,
    })
}

fn int_of(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Removes commas that directly precede `}` or `]` (outside strings).
fn strip_trailing_commas(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut in_str = false;
    let mut escaped = false;
    for (i, ch) in text.char_indices() {
        if in_str {
            out.push(ch);
            if escaped {
                escaped = false;
            } else if ch == '\\' {
                escaped = true;
            } else if ch == '"' {
                in_str = false;
            }
            continue;
        }
        match ch {
            '"' => {
                in_str = true;
                out.push(ch);
            }
            ',' => {
                let next = bytes[i + 1..].iter().find(|b| !b.is_ascii_whitespace());
                if !matches!(next, Some(b'}') | Some(b']')) {
                    out.push(ch);
                }
            }
            _ => out.push(ch),
        }
    }
    out
}

/// Values substituted into templates for one client.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Vars<'a> {
    /// `%i`: the client's sequence number.
    pub seq: u64,
    /// `%c`: the client id.
    pub client_id: &'a str,
    /// `%u`: the username ("" when none).
    pub username: &'a str,
}

/// True if `template` holds `%i`, `%c` or `%u`: it renders differently for each client.
pub(crate) fn has_client_variable(template: &str) -> bool {
    ["%i", "%c", "%u"].iter().any(|v| template.contains(v))
}

/// Substitutes `%i`, `%c` and `%u` (topic names, `-t`). `%%` is a literal `%`.
pub(crate) fn render_topic(template: &str, vars: Vars<'_>) -> String {
    render(template, vars, false)
}

/// Substitutes `%i`, `%c`, `%u` and `%pN` (N pages of 4 KiB of `a`).
pub(crate) fn render_value(template: &str, vars: Vars<'_>) -> String {
    render(template, vars, true)
}

fn render(template: &str, vars: Vars<'_>, pages: bool) -> String {
    if !template.contains('%') {
        return template.to_string();
    }
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(pos) = rest.find('%') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        match after.as_bytes().first() {
            Some(b'i') => {
                out.push_str(&vars.seq.to_string());
                rest = &after[1..];
            }
            Some(b'c') => {
                out.push_str(vars.client_id);
                rest = &after[1..];
            }
            Some(b'u') => {
                out.push_str(vars.username);
                rest = &after[1..];
            }
            Some(b'%') => {
                out.push('%');
                rest = &after[1..];
            }
            Some(b'p') if pages => {
                let digits = after[1..].bytes().take_while(u8::is_ascii_digit).count();
                match after[1..1 + digits].parse::<usize>() {
                    Ok(n) => {
                        out.extend(std::iter::repeat_n('a', n * PAGE));
                        rest = &after[1 + digits..];
                    }
                    Err(_) => {
                        out.push('%');
                        rest = after;
                    }
                }
            }
            _ => {
                out.push('%');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A topic of the spec made concrete for one client: its topic name and its payload split around
/// the timestamp value, so each message costs two copies and a number.
#[derive(Clone, Debug)]
pub(crate) struct RenderedTopic {
    /// The topic name.
    pub topic: String,
    /// QoS 0..=2.
    pub qos: u8,
    /// Retain flag.
    pub retain: bool,
    /// Milliseconds between messages.
    pub interval_ms: u64,
    /// Payload bytes before the timestamp value (the whole payload without injection).
    pub head: Vec<u8>,
    /// Payload bytes after the timestamp value.
    pub tail: Vec<u8>,
    /// Unit of the injected timestamp.
    pub inject: Option<TsUnit>,
    /// QUIC stream number (0: the control stream).
    pub stream: u64,
    /// QUIC stream priority.
    pub stream_priority: Option<i64>,
}

impl RenderedTopic {
    /// Writes one payload stamped with `epoch_ns` into `out`.
    pub(crate) fn write_payload(&self, epoch_ns: u64, out: &mut impl Extend<u8>) {
        out.extend(self.head.iter().copied());
        if let Some(unit) = self.inject {
            write_decimal(unit.scale(epoch_ns), out);
        }
        out.extend(self.tail.iter().copied());
    }

    /// Length of the payload (timestamps of the same width).
    pub(crate) fn approx_len(&self) -> usize {
        self.head.len() + self.tail.len() + if self.inject.is_some() { 20 } else { 0 }
    }
}

/// Writes `v` in decimal without allocating.
pub(crate) fn write_decimal(mut v: u64, out: &mut impl Extend<u8>) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend(buf[i..].iter().copied());
}

/// Marker the payload holds in place of the timestamp while it is rendered.
const TS_MARK: &str = "\u{1}braid-ts\u{1}";

impl TopicEntry {
    /// Renders this topic for one client.
    pub(crate) fn render_for(&self, vars: Vars<'_>) -> RenderedTopic {
        let topic = render_topic(&self.name, vars);
        let (head, tail) = match &self.payload {
            Value::String(s) => {
                let body = if self.render.is_some() { render_value(s, vars) } else { s.clone() };
                (body.into_bytes(), Vec::new())
            }
            value => {
                let mut obj = value.as_object().cloned().unwrap_or_default();
                if let Some(field) = &self.render {
                    if let Some(Value::String(s)) = obj.get(field) {
                        let rendered = render_value(s, vars);
                        obj.insert(field.clone(), Value::String(rendered));
                    }
                }
                if self.inject_timestamp.is_some() {
                    obj.insert("timestamp".into(), Value::String(TS_MARK.into()));
                }
                let text = Value::Object(obj).to_string();
                let mark = serde_json::to_string(TS_MARK).expect("string");
                let mark = &mark[1..mark.len() - 1];
                match text.find(mark) {
                    Some(pos) if self.inject_timestamp.is_some() => {
                        (text.as_bytes()[..pos].to_vec(), text.as_bytes()[pos + mark.len()..].to_vec())
                    }
                    _ => (text.into_bytes(), Vec::new()),
                }
            }
        };
        RenderedTopic {
            topic,
            qos: self.qos,
            retain: self.retain,
            interval_ms: self.interval_ms,
            head,
            tail,
            inject: if self.payload.is_object() { self.inject_timestamp } else { None },
            stream: self.stream,
            stream_priority: self.stream_priority,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOG: &str = r#"{
      "topics" : [
          {"name": "Topic1",
           "interval_ms": "100",
           "inject_timestamp" : true,
           "QoS": 1,
           "payload_encoding": "eterm",
           "payload": {"foo1" : "bar1", "timestamp": "0", "Data": "10"},
           "stream" : 1,
           "stream_priority": 200,
          },
          {"name": "Topic2",
           "interval_ms": "5000",
           "inject_timestamp" : "ms",
           "QoS": 1,
           "payload_encoding": "eterm",
           "payload": {"foo2" : "bar2", "timestamp": "0", "VIN" : "VIN", "Data": "%p2"},
           "stream" : 2,
           "stream_priority": 8,
           "render": "Data",
          }
      ]
    }"#;

    fn vars() -> Vars<'static> {
        Vars { seq: 7, client_id: "c7", username: "u" }
    }

    #[test]
    fn parses_the_blog_example_with_trailing_commas() {
        let spec = TopicSpec::parse(BLOG).unwrap();
        assert_eq!(spec.topics.len(), 2);
        let t1 = &spec.topics[0];
        assert_eq!(t1.name, "Topic1");
        assert_eq!(t1.interval_ms, 100);
        assert_eq!(t1.qos, 1);
        assert_eq!(t1.inject_timestamp, Some(TsUnit::Ns));
        assert_eq!(t1.stream, 1);
        assert_eq!(t1.stream_priority, Some(200));
        assert_eq!(t1.payload_encoding, "eterm");
        let t2 = &spec.topics[1];
        assert_eq!(t2.interval_ms, 5000);
        assert_eq!(t2.inject_timestamp, Some(TsUnit::Ms));
        assert_eq!(t2.render.as_deref(), Some("Data"));
        assert!(spec.uses_streams());
    }

    #[test]
    fn commas_inside_strings_survive() {
        let spec = TopicSpec::parse(r#"{"topics":[{"name":"a,}","payload":{"x":"1, ]"},}]}"#).unwrap();
        assert_eq!(spec.topics[0].name, "a,}");
        assert_eq!(spec.topics[0].payload["x"], "1, ]");
        assert!(!spec.uses_streams());
    }

    #[test]
    fn rejects_bad_specs() {
        assert!(TopicSpec::parse("{}").unwrap_err().contains("topics"));
        assert!(TopicSpec::parse(r#"{"topics":[]}"#).is_err());
        assert!(TopicSpec::parse(r#"{"topics":[{"interval_ms":1}]}"#).unwrap_err().contains("name"));
        assert!(TopicSpec::parse(r#"{"topics":[{"name":"t","QoS":3}]}"#).unwrap_err().contains("QoS"));
        assert!(TopicSpec::parse(r#"{"topics":[{"name":"t","interval_ms":"x"}]}"#).is_err());
        assert!(TopicSpec::parse(r#"{"topics":[{"name":"t","inject_timestamp":"h"}]}"#).is_err());
        assert!(TopicSpec::parse("not json").is_err());
    }

    #[test]
    fn renders_variables_and_pages() {
        assert_eq!(render_topic("t/%i/%c/%u/%%/%x", vars()), "t/7/c7/u/%/%x");
        assert_eq!(render_topic("t/%p2", vars()), "t/%p2");
        let v = render_value("<%p2>", vars());
        assert_eq!(v.len(), 2 + 2 * PAGE);
        assert!(v[1..v.len() - 1].bytes().all(|b| b == b'a'));
        assert_eq!(render_value("%pz%i", vars()), "%pz7");
        assert_eq!(render_value("%p0", vars()), "");
    }

    #[test]
    fn renders_payload_with_timestamp_slot() {
        let spec = TopicSpec::parse(BLOG).unwrap();
        let t2 = spec.topics[1].render_for(vars());
        assert_eq!(t2.topic, "Topic2");
        let mut out = Vec::new();
        t2.write_payload(1_700_000_000_123_456_789, &mut out);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["timestamp"], "1700000000123");
        assert_eq!(v["VIN"], "VIN");
        assert_eq!(v["Data"].as_str().unwrap().len(), 2 * PAGE);
        let t1 = spec.topics[0].render_for(vars());
        let mut out = Vec::new();
        t1.write_payload(42, &mut out);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["timestamp"], "42");
        assert_eq!(v["Data"], "10", "not rendered: no render field");
    }

    #[test]
    fn string_payload_and_no_injection() {
        let spec =
            TopicSpec::parse(r#"{"topics":[{"name":"x/%c","payload":"hi %i","render":"-"}]}"#).unwrap();
        let r = spec.topics[0].render_for(vars());
        assert_eq!(r.topic, "x/c7");
        let mut out = Vec::new();
        r.write_payload(1, &mut out);
        assert_eq!(out, b"hi 7");
        assert_eq!(r.inject, None);
    }
}
