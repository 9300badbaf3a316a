//! `/api/v1/rules`: the configured rules with their counters, and the rule tester
//! (`POST /api/v1/rules/test`: a rule's SQL and a sample message in, the rule's output out).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use braid_proto::ByteString;
use braid_rules::{Context, Event, Rule};

use crate::api::{error, Body};
use crate::Admin;

/// `GET /rules`: every rule, in configuration order, with what it did since the start.
pub(crate) async fn list(State(admin): State<Arc<Admin>>) -> Json<Value> {
    let data: Vec<Value> = admin
        .broker
        .rules()
        .reports()
        .into_iter()
        .map(|r| {
            json!({
                "name": r.config.name,
                "sql": r.config.sql,
                "actions": r.config.actions,
                "matched": r.matched,
                "passed": r.passed,
                "failed": r.failed,
                "last_error": r.last_error,
            })
        })
        .collect();
    Json(json!({ "data": data }))
}

/// `POST /rules/test`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Test {
    sql: String,
    #[serde(default)]
    context: Sample,
}

/// The message or client event a rule is tried on; what is left out is empty (the topic: the
/// rule's first topic filter, if it has no wildcard). `event` names a client event
/// (`client.connected` or `$events/client_connected`); any other key is one of its fields
/// (`reason`, `keepalive`, ...).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Sample {
    event: Option<String>,
    topic: Option<String>,
    #[serde(default)]
    payload: String,
    #[serde(default)]
    clientid: String,
    username: Option<String>,
    peerhost: Option<String>,
    #[serde(default)]
    qos: u8,
    #[serde(default)]
    retain: bool,
    timestamp: Option<i64>,
    #[serde(default)]
    user_properties: serde_json::Map<String, Value>,
    #[serde(flatten)]
    fields: serde_json::Map<String, Value>,
}

/// Compiles `sql` (400 naming the position and the problem) and runs it on the sample:
/// `{"matched": true, "output": {...}}`, or `{"matched": false}` when FROM or WHERE does not
/// select the sample.
pub(crate) async fn test(Body(t): Body<Test>) -> Response {
    let rule = match Rule::compile("test", &t.sql) {
        Ok(rule) => rule,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("sql: {e}")),
    };
    let s = t.context;
    if s.qos > 2 {
        return error(StatusCode::BAD_REQUEST, "context.qos is 0, 1 or 2");
    }
    let event = match s.event.as_deref() {
        None | Some("message.publish") => Event::MessagePublish,
        Some(name) => {
            match Event::CLIENT_EVENTS.into_iter().find(|e| e.name() == name || e.topic() == Some(name)) {
                Some(event) => event,
                None => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        format!("context.event {name:?} is not a client event"),
                    )
                }
            }
        }
    };
    let topic = match (s.topic, rule.topic_filters().first()) {
        (Some(topic), _) => topic,
        (None, _) if event != Event::MessagePublish => String::new(),
        (None, Some(filter)) if !filter.contains(['+', '#']) => filter.clone(),
        (None, _) => {
            return error(StatusCode::BAD_REQUEST, "context.topic is required: the rule's FROM has wildcards")
        }
    };
    let fields: Vec<(&str, Value)> = s.fields.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let mut user_properties = Vec::with_capacity(s.user_properties.len());
    for (k, v) in s.user_properties {
        let Value::String(v) = v else {
            return error(StatusCode::BAD_REQUEST, format!("context.user_properties.{k}: a string"));
        };
        user_properties.push((ByteString::from(k), ByteString::from(v)));
    }
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let ctx = Context {
        clientid: &s.clientid,
        username: s.username.as_deref(),
        peerhost: s.peerhost.as_deref(),
        topic: &topic,
        payload: s.payload.as_bytes(),
        qos: s.qos,
        retain: s.retain,
        timestamp: s.timestamp.unwrap_or(now_ms as i64),
        user_properties: &user_properties,
        event,
        fields: &fields,
        ..Context::default()
    };
    match rule.apply(&ctx) {
        Some(output) => Json(json!({ "matched": true, "output": output })).into_response(),
        None => Json(json!({ "matched": false })).into_response(),
    }
}
