//! `/api/v1/rules`: the rules in force with their counters, made, changed and deleted through
//! the API (those of the configuration file are changed in the file), and the rule tester
//! (`POST /api/v1/rules/test`: a rule's SQL and a sample message in, the rule's output out).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use braid_broker::config::RuleConfig;
use braid_broker::rule_book::{EditError, Source};
use braid_broker::rules::RuleReport;
use braid_proto::ByteString;
use braid_rules::{Context, Event, Rule};

use crate::api::{error, Body};
use crate::Admin;

/// `GET /rules`: every rule, in the order they run, with where it is defined and what it did
/// since the start (or since its last change).
pub(crate) async fn list(State(admin): State<Arc<Admin>>) -> Json<Value> {
    let reports = admin.broker.rules().reports();
    let data: Vec<Value> =
        admin.book.rules().into_iter().map(|(rule, source)| described(rule, source, &reports)).collect();
    Json(json!({ "data": data }))
}

/// `GET /rules/{name}`.
pub(crate) async fn one(State(admin): State<Arc<Admin>>, Path(name): Path<String>) -> Response {
    let reports = admin.broker.rules().reports();
    match admin.book.rules().into_iter().find(|(r, _)| r.name == name) {
        Some((rule, source)) => Json(described(rule, source, &reports)).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no rule named {name:?}")),
    }
}

/// `POST /rules`: a rule made through the API (201), kept across restarts.
pub(crate) async fn create(State(admin): State<Arc<Admin>>, Body(rule): Body<RuleConfig>) -> Response {
    let name = rule.name.clone();
    edited(admin.book.put_rule(rule, true), StatusCode::CREATED, || rule_now(&admin, &name))
}

/// `PUT /rules/{name}`: changes a rule made through the API (its `name` in the body may be
/// left out).
pub(crate) async fn replace(
    State(admin): State<Arc<Admin>>,
    Path(name): Path<String>,
    Body(mut rule): Body<RuleConfig>,
) -> Response {
    let result = same_name(&mut rule.name, &name).and_then(|()| admin.book.put_rule(rule, false));
    edited(result, StatusCode::OK, || rule_now(&admin, &name))
}

/// `DELETE /rules/{name}`: deletes a rule made through the API (204).
pub(crate) async fn delete(State(admin): State<Arc<Admin>>, Path(name): Path<String>) -> Response {
    edited(admin.book.delete_rule(&name), StatusCode::NO_CONTENT, || Value::Null)
}

/// The rule `name` as `GET /rules/{name}` answers it.
fn rule_now(admin: &Admin, name: &str) -> Value {
    let reports = admin.broker.rules().reports();
    let found = admin.book.rules().into_iter().find(|(r, _)| r.name == name);
    found.map_or(Value::Null, |(rule, source)| described(rule, source, &reports))
}

/// `rule` from `source` with its counters among `reports` (none yet: zeros).
fn described(rule: RuleConfig, source: Source, reports: &[RuleReport]) -> Value {
    let report = reports.iter().find(|r| r.config.name == rule.name);
    json!({
        "name": rule.name,
        "sql": rule.sql,
        "actions": rule.actions,
        "source": source,
        "matched": report.map_or(0, |r| r.matched),
        "passed": report.map_or(0, |r| r.passed),
        "failed": report.map_or(0, |r| r.failed),
        "last_error": report.and_then(|r| r.last_error.clone()),
    })
}

/// A body's `name`, if any, must be the path's (an empty one becomes it).
pub(crate) fn same_name(body: &mut String, path: &str) -> Result<(), EditError> {
    if body.is_empty() {
        *body = path.to_string();
    }
    match body == path {
        true => Ok(()),
        false => Err(EditError::Invalid(format!("name {body:?} in the body is not {path:?} of the path"))),
    }
}

/// The answer to a change: `status` with `now()` (what was made), or the error's status and
/// message (400 invalid, 404 not found, 409 a conflict, 500 not saved).
pub(crate) fn edited(
    result: Result<(), EditError>,
    status: StatusCode,
    now: impl FnOnce() -> Value,
) -> Response {
    match result {
        Ok(()) if status == StatusCode::NO_CONTENT => status.into_response(),
        Ok(()) => (status, Json(now())).into_response(),
        Err(e) => {
            let status = match e {
                EditError::Invalid(_) => StatusCode::BAD_REQUEST,
                EditError::NotFound(_) => StatusCode::NOT_FOUND,
                EditError::Conflict(_) => StatusCode::CONFLICT,
                EditError::Save { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error(status, e.to_string())
        }
    }
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
