//! `/api/v1/sinks`: the sinks in force with their state and counters, made, changed and deleted
//! through the API (those of the configuration file are changed in the file). A sink's URL
//! password and token are written as `***`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use braid_broker::config::SinkConfig;
use braid_broker::rule_book::Source;

use crate::api::{error, reported, Body};
use crate::rules::{edited, same_name};
use crate::Admin;

/// `GET /sinks`: every sink with where it is defined, its configuration, state and counters.
pub(crate) async fn list(State(admin): State<Arc<Admin>>) -> Json<Value> {
    let counters = reported(&admin, "sinks");
    let data: Vec<Value> =
        admin.book.sinks().into_iter().map(|(sink, source)| described(&sink, source, &counters)).collect();
    Json(json!({ "data": data }))
}

/// `GET /sinks/{name}`.
pub(crate) async fn one(State(admin): State<Arc<Admin>>, Path(name): Path<String>) -> Response {
    match sink_now(&admin, &name) {
        Value::Null => error(StatusCode::NOT_FOUND, format!("no sink named {name:?}")),
        sink => Json(sink).into_response(),
    }
}

/// `POST /sinks`: a sink made through the API (201), kept across restarts; its worker starts.
pub(crate) async fn create(State(admin): State<Arc<Admin>>, Body(sink): Body<SinkConfig>) -> Response {
    let name = sink.name.clone();
    edited(admin.book.put_sink(sink, true), StatusCode::CREATED, || sink_now(&admin, &name))
}

/// `PUT /sinks/{name}`: changes a sink made through the API; its worker starts again on the
/// same outbox.
pub(crate) async fn replace(
    State(admin): State<Arc<Admin>>,
    Path(name): Path<String>,
    Body(mut sink): Body<SinkConfig>,
) -> Response {
    let result = same_name(&mut sink.name, &name).and_then(|()| admin.book.put_sink(sink, false));
    edited(result, StatusCode::OK, || sink_now(&admin, &name))
}

/// `DELETE /sinks/{name}`: deletes a sink made through the API that no rule names (204); its
/// outbox is ended with what it held.
pub(crate) async fn delete(State(admin): State<Arc<Admin>>, Path(name): Path<String>) -> Response {
    edited(admin.book.delete_sink(&name), StatusCode::NO_CONTENT, || Value::Null)
}

/// The sink `name` as `GET /sinks/{name}` answers it; null if there is none.
fn sink_now(admin: &Admin, name: &str) -> Value {
    let counters = reported(admin, "sinks");
    let found = admin.book.sinks().into_iter().find(|(s, _)| s.name == name);
    found.map_or(Value::Null, |(sink, source)| described(&sink, source, &counters))
}

/// `sink` from `source`: its counters among `counters` (zeros while its worker starts), its
/// configuration with secrets hidden.
fn described(sink: &SinkConfig, source: Source, counters: &[Value]) -> Value {
    let config = serde_json::to_value(sink.redacted()).unwrap_or(Value::Null);
    let mut entry = json!({
        "name": sink.name, "kind": sink.kind.as_str(), "source": source, "config": config, "state": "down",
        "sent": 0, "retried": 0, "failed": 0, "dropped": 0, "inflight": 0, "queued": 0,
    });
    if let Some(c) = counters.iter().find(|c| c["name"] == sink.name.as_str()).and_then(Value::as_object) {
        for (key, value) in c {
            entry[key] = value.clone();
        }
    }
    entry
}
