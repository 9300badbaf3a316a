//! The REST API, `/api/v1/...`: JSON in and out; a client's mistake is a 4xx whose JSON body
//! names the problem (`{"error": "...", "code": "..."}`), never a 500. Lists are paged:
//! `?page=1&limit=100` (at most 1000), answered as `{"data": [...], "meta": {"page", "limit",
//! "count"}}` where `count` is every match.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{FromRequest, FromRequestParts, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use braid_broker::balance::Refusal;
use braid_broker::broker::admin::ClientInfo;
use braid_broker::message::Message;
use braid_broker::metrics::Metrics;
use braid_broker::retained::Kept;
use braid_broker::trace::{Target, Trace};
use braid_broker::transport::Transport;
use braid_proto::topic::{valid_topic_filter, valid_topic_name};
use braid_proto::{ByteString, Bytes, ProtocolVersion, Publish, QoS, ReasonCode, SubscriptionOptions};

use crate::Admin;

type Shared = State<Arc<Admin>>;

/// The routes under `/api/v1`.
pub(crate) fn routes() -> Router<Arc<Admin>> {
    Router::new()
        .route("/health", get(health))
        .route("/stats", get(stats))
        .route("/listeners", get(listeners))
        .route("/clients", get(clients))
        .route("/clients/{id}", get(client).delete(kick))
        .route("/clients/{id}/subscriptions", get(client_subscriptions).post(subscribe).delete(unsubscribe))
        .route("/subscriptions", get(subscriptions))
        .route("/retained", get(retained_list))
        .route("/retained/{*topic}", get(retained_one).delete(retained_delete))
        .route("/publish", post(publish))
        .route("/nodes", get(nodes))
        .route("/nodes/{node}/drain", post(drain).delete(cancel_drain))
        .route("/cluster/rebalance", post(rebalance))
        .route("/bridges", get(bridges))
        .route("/sinks", get(crate::sinks::list).post(crate::sinks::create))
        .route(
            "/sinks/{sink}",
            get(crate::sinks::one).put(crate::sinks::replace).delete(crate::sinks::delete),
        )
        .route("/rules", get(crate::rules::list).post(crate::rules::create))
        .route("/rules/test", post(crate::rules::test))
        .route(
            "/rules/{rule}",
            get(crate::rules::one).put(crate::rules::replace).delete(crate::rules::delete),
        )
        .route("/reload", post(reload))
        .route("/traces", get(traces).post(start_trace))
        .route("/traces/{name}", axum::routing::delete(stop_trace))
        .route("/traces/{name}/log", get(trace_log))
        .fallback(|| async {
            error(StatusCode::NOT_FOUND, "no such endpoint under /api/v1 (see docs/api.md)")
        })
}

/// A JSON error: `{"error": message, "code": the status's name}`.
pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    ApiError(status, message.into()).into_response()
}

/// A request that cannot be served: its status and what is wrong.
#[derive(Debug)]
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = self.0.canonical_reason().unwrap_or("error").to_ascii_uppercase().replace(' ', "_");
        (self.0, Json(json!({ "error": self.1, "code": code }))).into_response()
    }
}

/// A JSON body whose rejection is the API's error ([`ApiError`], naming the problem).
pub(crate) struct Body<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = Response;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Response> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(e) => Err(error(e.status(), format!("bad JSON body: {}", e.body_text()))),
        }
    }
}

/// An optional JSON object body of settings (empty: `{}`), whose rejection is the API's error.
struct Settings(serde_json::Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for Settings {
    type Rejection = Response;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Response> {
        let body = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| error(e.status(), e.body_text()))?;
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Settings(serde_json::Map::new()));
        }
        match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(map)) => Ok(Settings(map)),
            Ok(_) => Err(error(StatusCode::BAD_REQUEST, "the body is a JSON object, e.g. {\"rate\": 100}")),
            Err(e) => Err(error(StatusCode::BAD_REQUEST, format!("bad JSON body: {e}"))),
        }
    }
}

impl Settings {
    /// The settings, each an integer within its range, its default when absent: `(name, range,
    /// default)`. A 400 names a setting out of range, or one not among them.
    fn integers<const N: usize>(
        &self,
        known: [(&str, std::ops::RangeInclusive<u64>, u64); N],
    ) -> Result<[u64; N], ApiError> {
        let bad = |m: String| ApiError(StatusCode::BAD_REQUEST, m);
        if let Some(other) = self.0.keys().find(|k| !known.iter().any(|(name, ..)| name == k)) {
            let names: Vec<&str> = known.iter().map(|(name, ..)| *name).collect();
            return Err(bad(format!("unknown field {other:?}: the body may have {}", names.join(", "))));
        }
        let mut out = [0; N];
        for (slot, (name, range, default)) in out.iter_mut().zip(known) {
            *slot = match self.0.get(name) {
                None => default,
                Some(v) => v.as_u64().filter(|n| range.contains(n)).ok_or_else(|| {
                    bad(format!("{name}: {v} is not an integer from {} to {}", range.start(), range.end()))
                })?,
            };
        }
        Ok(out)
    }
}

/// A query string whose rejection is the API's error.
struct Params<T>(T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, Response> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(Params(v)),
            Err(e) => Err(error(StatusCode::BAD_REQUEST, format!("bad query string: {}", e.body_text()))),
        }
    }
}

/// `?page=&limit=`, in each list's query (serde's `flatten` cannot read numbers from a query).
#[derive(Debug)]
struct Page {
    page: usize,
    limit: usize,
}

impl Page {
    fn new(page: Option<usize>, limit: Option<usize>) -> Page {
        Page { page: page.unwrap_or(1), limit: limit.unwrap_or(100) }
    }

    /// `items`' page as `{"data", "meta"}`, or a 400 for a page or limit out of range.
    fn of(&self, items: Vec<Value>) -> Response {
        if self.page == 0 || self.limit == 0 || self.limit > 1000 {
            return error(StatusCode::BAD_REQUEST, "page starts at 1; limit is 1 to 1000");
        }
        let count = items.len();
        let data: Vec<Value> =
            items.into_iter().skip((self.page - 1).saturating_mul(self.limit)).take(self.limit).collect();
        Json(json!({ "data": data, "meta": { "page": self.page, "limit": self.limit, "count": count } }))
            .into_response()
    }
}

async fn health(State(admin): Shared) -> Response {
    let ready = !admin.broker.shutdown().is_cancelled();
    let body = json!({
        "status": if ready { "ok" } else { "shutting_down" },
        "live": true,
        "ready": ready,
        "uptime_secs": admin.broker.started().elapsed().as_secs(),
        "version": env!("CARGO_PKG_VERSION"),
    });
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}

async fn stats(State(admin): Shared) -> Json<Value> {
    let b = &admin.broker;
    let m = &b.metrics();
    let per_transport = |f: &dyn Fn(Transport) -> u64| {
        Value::Object(Transport::ALL.iter().map(|t| (t.name().to_string(), json!(f(*t)))).collect())
    };
    let by_qos = |q: &braid_broker::metrics::ByQos| json!({ "0": q.get(QoS::AtMostOnce), "1": q.get(QoS::AtLeastOnce), "2": q.get(QoS::ExactlyOnce) });
    let refused: serde_json::Map<String, Value> =
        [("max_connections", &m.connections_refused), ("out_of_file_descriptors", &m.connections_refused_fd)]
            .into_iter()
            .map(|(k, c)| (k.to_string(), json!(Metrics::get(c))))
            .chain(
                m.connects_refused
                    .counted()
                    .into_iter()
                    .map(|(r, n)| (crate::prom::snake(r.description()), json!(n))),
            )
            .collect();
    let (sessions, subscriptions, retained) = b.counts();
    let totals = b.operators().queue_totals();
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_secs": b.started().elapsed().as_secs(),
        "connections": {
            "connected": Metrics::get(&m.clients_connected),
            "maximum": Metrics::get(&m.clients_maximum),
            "parked": b.parked(),
            "by_transport": per_transport(&|t| Metrics::get(m.connected_by_transport.get(t))),
            "accepted": per_transport(&|t| Metrics::get(m.connections_accepted.get(t))),
            "refused": refused,
        },
        "messages": {
            "received": by_qos(&m.messages_received),
            "sent": by_qos(&m.messages_sent),
            "dropped": {
                "queue_full": Metrics::get(&m.dropped_queue_full),
                "expired": Metrics::get(&m.dropped_expired),
                "too_large": Metrics::get(&m.dropped_too_large),
                "not_authorized": Metrics::get(&m.publishes_denied),
            },
            "held": Metrics::get(&m.publishes_held),
            "retained_refused": Metrics::get(&m.retained_refused),
        },
        "bytes": { "received": Metrics::get(&m.bytes_received), "sent": Metrics::get(&m.bytes_sent) },
        "sessions": sessions,
        "subscriptions": subscriptions,
        "retained": retained,
        "queued": totals.queued,
        "inflight": totals.inflight,
        "publishers_held": totals.publishers_held,
        "memory": {
            "resident_bytes": braid_broker::limits::resident_memory(),
            "alarm": b.memory().is_raised(),
        },
        "store": { "disk_bytes": b.store().stats().disk_bytes },
    }))
}

async fn listeners(State(admin): Shared) -> Json<Value> {
    let m = &admin.broker.metrics();
    let mut out: Vec<Value> = admin
        .listeners
        .iter()
        .map(|(t, addr)| {
            json!({
                "transport": t.name(),
                "address": addr.to_string(),
                "connected": Metrics::get(m.connected_by_transport.get(*t)),
                "accepted": Metrics::get(m.connections_accepted.get(*t)),
            })
        })
        .collect();
    let scheme = if admin.broker.config().admin.tls { "https" } else { "http" };
    out.push(json!({ "transport": scheme, "address": admin.http.to_string() }));
    Json(json!({ "data": out }))
}

/// `GET /clients` filters.
#[derive(Debug, Deserialize)]
struct ClientFilter {
    prefix: Option<String>,
    user: Option<String>,
    transport: Option<String>,
    state: Option<String>,
    page: Option<usize>,
    limit: Option<usize>,
}

fn protocol(v: ProtocolVersion) -> u8 {
    match v {
        ProtocolVersion::V3_1 => 3,
        ProtocolVersion::V3_1_1 => 4,
        ProtocolVersion::V5 => 5,
    }
}

fn transport_name(info: &ClientInfo) -> Option<&'static str> {
    info.connection.as_ref().map(|(o, _)| o.transport.map_or("in_process", |t| t.name()))
}

fn client_json(info: &ClientInfo, detail: bool) -> Value {
    let conn = info.connection.as_ref();
    let mut v = json!({
        "client_id": info.client_id.to_string(),
        "connected": conn.is_some(),
        "transport": transport_name(info),
        "peer": conn.map(|(o, _)| o.peer.to_string()),
        "username": conn.and_then(|(o, _)| o.username.as_ref().map(|u| u.to_string())),
        "protocol": conn.map(|(_, v)| protocol(*v)),
        "keep_alive": conn.map(|(o, _)| o.keep_alive),
        "connected_at": conn.map(|(o, _)| o.connected_at),
        "persistent": info.persistent,
        "expiry_secs": info.expiry_secs,
        "queued": info.queued,
        "inflight": info.inflight,
        "dropped": info.dropped,
        "subscriptions": info.subscriptions.len(),
    });
    if detail {
        v["subscriptions"] =
            Value::Array(info.subscriptions.iter().map(|(f, r)| subscription_json(None, f, r)).collect());
    }
    v
}

fn subscription_json(
    client_id: Option<&str>,
    filter: &str,
    r: &braid_broker::store::SubscriptionRecord,
) -> Value {
    let mut v = json!({
        "filter": filter,
        "qos": r.options.qos as u8,
        "no_local": r.options.no_local,
        "retain_as_published": r.options.retain_as_published,
        "retain_handling": r.options.retain_handling as u8,
        "subscription_id": r.sub_id,
    });
    if let Some(id) = client_id {
        v["client_id"] = json!(id);
    }
    v
}

async fn clients(State(admin): Shared, Params(f): Params<ClientFilter>) -> Response {
    let state = f.state.as_deref();
    if !matches!(state, None | Some("connected" | "offline")) {
        return error(StatusCode::BAD_REQUEST, "state is connected or offline");
    }
    let known = Transport::ALL.iter().map(|t| t.name()).chain(["in_process"]).collect::<Vec<_>>();
    if let Some(t) = f.transport.as_deref().filter(|t| !known.contains(t)) {
        return error(StatusCode::BAD_REQUEST, format!("transport {t:?} is not one of {}", known.join(", ")));
    }
    let mut all = admin.broker.operators().clients();
    all.retain(|c| {
        f.prefix.as_deref().lets_through(|p| c.client_id.starts_with(p))
            && f.user
                .as_deref()
                .lets_through(|u| c.connection.as_ref().and_then(|(o, _)| o.username.as_deref()) == Some(u))
            && f.transport.as_deref().lets_through(|t| transport_name(c) == Some(t))
            && match state {
                Some("connected") => c.connection.is_some(),
                Some("offline") => c.connection.is_none(),
                _ => true,
            }
    });
    all.sort_by(|a, b| a.client_id.cmp(&b.client_id));
    Page::new(f.page, f.limit).of(all.iter().map(|c| client_json(c, false)).collect())
}

/// `Option<&str>` as a filter: None or "" lets everything through.
trait OptionalFilter {
    fn lets_through(&self, keep: impl FnOnce(&str) -> bool) -> bool;
}

impl OptionalFilter for Option<&str> {
    fn lets_through(&self, keep: impl FnOnce(&str) -> bool) -> bool {
        match *self {
            None | Some("") => true,
            Some(v) => keep(v),
        }
    }
}

/// A 403 for a client id under `$internal/` (Braid's own in-process clients: a bridge's outbox):
/// operators see them, and do not kick or subscribe them.
fn internal(id: &str) -> Option<Response> {
    id.starts_with(braid_broker::session::IN_PROCESS).then(|| {
        error(StatusCode::FORBIDDEN, format!("{id:?} is one of Braid's own in-process clients (a bridge's)"))
    })
}

fn no_client(id: &str) -> Response {
    error(StatusCode::NOT_FOUND, format!("no session of client {id:?} on this node"))
}

async fn client(State(admin): Shared, Path(id): Path<String>) -> Response {
    match admin.broker.operators().client(&id) {
        Some(info) => Json(client_json(&info, true)).into_response(),
        None => no_client(&id),
    }
}

async fn kick(State(admin): Shared, Path(id): Path<String>) -> Response {
    if let Some(refused) = internal(&id) {
        return refused;
    }
    if admin.broker.operators().kick(&id) {
        tracing::info!(client_id = %id, "an operator closed the client's connection (API)");
        return StatusCode::NO_CONTENT.into_response();
    }
    match admin.broker.operators().client(&id) {
        Some(_) => error(StatusCode::CONFLICT, format!("client {id:?} is not connected")),
        None => no_client(&id),
    }
}

async fn client_subscriptions(State(admin): Shared, Path(id): Path<String>) -> Response {
    match admin.broker.operators().client(&id) {
        Some(info) => {
            let data: Vec<Value> =
                info.subscriptions.iter().map(|(f, r)| subscription_json(None, f, r)).collect();
            Json(json!({ "data": data })).into_response()
        }
        None => no_client(&id),
    }
}

/// `POST /clients/{id}/subscriptions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSubscription {
    filter: String,
    #[serde(default)]
    qos: u8,
    #[serde(default)]
    no_local: bool,
    #[serde(default)]
    retain_as_published: bool,
}

async fn subscribe(State(admin): Shared, Path(id): Path<String>, Body(s): Body<NewSubscription>) -> Response {
    if let Some(refused) = internal(&id) {
        return refused;
    }
    let Some(qos) = QoS::from_u8(s.qos) else { return error(StatusCode::BAD_REQUEST, "qos is 0, 1 or 2") };
    let options = SubscriptionOptions {
        qos,
        no_local: s.no_local,
        retain_as_published: s.retain_as_published,
        ..Default::default()
    };
    match admin.broker.operators().subscribe_for(&id, &s.filter, options, Instant::now()) {
        None => no_client(&id),
        Some(reason) if reason.is_error() => error(
            StatusCode::BAD_REQUEST,
            format!("subscription to {:?} refused: {}", s.filter, reason.description()),
        ),
        Some(reason) => (
            StatusCode::CREATED,
            Json(json!({ "filter": s.filter, "reason_code": reason as u8, "reason": reason.description() })),
        )
            .into_response(),
    }
}

/// `?filter=` of `DELETE /clients/{id}/subscriptions`.
#[derive(Debug, Deserialize)]
struct FilterQuery {
    filter: String,
}

async fn unsubscribe(
    State(admin): Shared,
    Path(id): Path<String>,
    Params(q): Params<FilterQuery>,
) -> Response {
    if let Some(refused) = internal(&id) {
        return refused;
    }
    match admin.broker.operators().unsubscribe_for(&id, &q.filter, Instant::now()) {
        None => no_client(&id),
        Some(true) => StatusCode::NO_CONTENT.into_response(),
        Some(false) => {
            error(StatusCode::NOT_FOUND, format!("client {id:?} has no subscription {:?}", q.filter))
        }
    }
}

/// `GET /subscriptions` filters.
#[derive(Debug, Deserialize)]
struct SubscriptionFilter {
    client_id: Option<String>,
    filter: Option<String>,
    page: Option<usize>,
    limit: Option<usize>,
}

async fn subscriptions(State(admin): Shared, Params(f): Params<SubscriptionFilter>) -> Response {
    let mut clients = admin.broker.operators().clients();
    clients.sort_by(|a, b| a.client_id.cmp(&b.client_id));
    let mut out = Vec::new();
    for c in clients.iter().filter(|c| f.client_id.as_deref().lets_through(|id| &*c.client_id == id)) {
        let mut subs: Vec<_> = c
            .subscriptions
            .iter()
            .filter(|(filter, _)| f.filter.as_deref().lets_through(|x| &**filter == x))
            .collect();
        subs.sort_by(|a, b| a.0.cmp(&b.0));
        out.extend(subs.into_iter().map(|(filter, r)| subscription_json(Some(&c.client_id), filter, r)));
    }
    Page::new(f.page, f.limit).of(out)
}

/// A retained message, with its age and the seconds until it expires (null: never) at `now`.
fn retained_json(kept: &Kept, now: Instant) -> Value {
    let msg = &kept.msg;
    let (payload, encoding) = match std::str::from_utf8(&msg.payload) {
        Ok(text) => (text.to_string(), "plain"),
        Err(_) => (base64::engine::general_purpose::STANDARD.encode(&msg.payload), "base64"),
    };
    let p = &msg.properties;
    let users: Vec<Value> =
        p.user_properties.iter().map(|(k, v)| json!([k.to_string(), v.to_string()])).collect();
    json!({
        "topic": msg.topic.to_string(),
        "qos": msg.qos as u8,
        "payload": payload,
        "payload_encoding": encoding,
        "payload_bytes": msg.payload.len(),
        "age_secs": now.saturating_duration_since(kept.since).as_secs(),
        "expires_in_secs": msg.expires_at.map(|at| at.saturating_duration_since(now).as_secs()),
        "properties": {
            "content_type": p.content_type.as_ref().map(|s| s.to_string()),
            "response_topic": p.response_topic.as_ref().map(|s| s.to_string()),
            "payload_format_indicator": p.payload_format_indicator,
            "user_properties": users,
        },
    })
}

/// `GET /retained` filters.
#[derive(Debug, Deserialize)]
struct RetainedFilter {
    #[serde(default = "everything")]
    filter: String,
    /// `topic` (the default), `size` (largest payload first) or `age` (oldest first).
    #[serde(default)]
    sort: RetainedOrder,
    page: Option<usize>,
    limit: Option<usize>,
}

/// How `GET /retained` orders its list.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RetainedOrder {
    #[default]
    Topic,
    Size,
    Age,
}

fn everything() -> String {
    "#".into()
}

async fn retained_list(State(admin): Shared, Params(f): Params<RetainedFilter>) -> Response {
    if !valid_topic_filter(&f.filter) {
        return error(StatusCode::BAD_REQUEST, format!("{:?} is not a valid topic filter", f.filter));
    }
    let now = Instant::now();
    let mut all = admin.broker.operators().retained_matching(&f.filter, now);
    all.sort_by(|a, b| a.msg.topic.cmp(&b.msg.topic));
    match f.sort {
        RetainedOrder::Topic => {}
        RetainedOrder::Size => all.sort_by_key(|k| std::cmp::Reverse(k.msg.payload.len())),
        RetainedOrder::Age => all.sort_by_key(|k| k.since),
    }
    Page::new(f.page, f.limit).of(all.iter().map(|k| retained_json(k, now)).collect())
}

/// The retained message of exactly `topic`, or the response to give instead.
fn retained_at(admin: &Admin, topic: &str) -> Result<Kept, ApiError> {
    if !valid_topic_name(topic) {
        return Err(ApiError(StatusCode::BAD_REQUEST, format!("{topic:?} is not a valid topic name")));
    }
    let found = admin
        .broker
        .operators()
        .retained_matching(topic, Instant::now())
        .into_iter()
        .find(|k| &*k.msg.topic == topic);
    found.ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no retained message at {topic:?}")))
}

async fn retained_one(State(admin): Shared, Path(topic): Path<String>) -> Response {
    match retained_at(&admin, &topic) {
        Ok(kept) => Json(retained_json(&kept, Instant::now())).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Clears a retained message the MQTT way: an empty retained publish to its topic, which every
/// node of a cluster and the store apply (subscribers get it as an empty message).
async fn retained_delete(State(admin): Shared, Path(topic): Path<String>) -> Response {
    if topic.starts_with("$SYS") {
        return error(StatusCode::FORBIDDEN, "topics under $SYS are the broker's own");
    }
    if let Err(e) = retained_at(&admin, &topic) {
        return e.into_response();
    }
    let msg = Message::internal(ByteString::from(topic.as_str()), Bytes::new(), true);
    let published = admin.broker.publish(msg, Instant::now());
    if let Err(e) = settle(&admin, published, QoS::AtLeastOnce).await {
        return e.into_response();
    }
    tracing::info!(%topic, "an operator cleared the retained message (API)");
    StatusCode::NO_CONTENT.into_response()
}

/// `POST /publish`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewPublish {
    topic: String,
    #[serde(default)]
    payload: String,
    #[serde(default)]
    payload_encoding: Option<String>,
    #[serde(default)]
    qos: u8,
    #[serde(default)]
    retain: bool,
    #[serde(default)]
    properties: Option<NewProperties>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewProperties {
    content_type: Option<String>,
    response_topic: Option<String>,
    correlation_data: Option<String>,
    message_expiry_interval: Option<u32>,
    payload_format_indicator: Option<u8>,
    #[serde(default)]
    user_properties: Vec<(String, String)>,
}

async fn publish(State(admin): Shared, Body(p): Body<NewPublish>) -> Response {
    let bad = |m: String| error(StatusCode::BAD_REQUEST, m);
    if !valid_topic_name(&p.topic) || p.topic.is_empty() {
        return bad(format!("{:?} is not a valid topic name (no wildcards, not empty)", p.topic));
    }
    if p.topic.starts_with("$SYS") {
        return bad("topics under $SYS are the broker's own".into());
    }
    if let Some(why) = braid_broker::limits::topic_too_big(&admin.broker.live().limits, &p.topic) {
        return bad(format!("{:?}: {why}", p.topic));
    }
    let Some(qos) = QoS::from_u8(p.qos) else { return bad("qos is 0, 1 or 2".into()) };
    if p.qos > admin.broker.config().mqtt.max_qos {
        return bad(format!("qos {} is above mqtt.max_qos ({})", p.qos, admin.broker.config().mqtt.max_qos));
    }
    let payload = match p.payload_encoding.as_deref() {
        None | Some("plain") => Bytes::from(p.payload),
        Some("base64") => match base64::engine::general_purpose::STANDARD.decode(p.payload.as_bytes()) {
            Ok(b) => Bytes::from(b),
            Err(e) => return bad(format!("payload is not base64: {e}")),
        },
        Some(other) => return bad(format!("payload_encoding {other:?} is not plain or base64")),
    };
    if payload.len() > admin.broker.config().mqtt.max_packet_size as usize {
        return error(StatusCode::PAYLOAD_TOO_LARGE, "payload larger than mqtt.max_packet_size");
    }
    let mut properties = braid_proto::Properties::default();
    if let Some(np) = p.properties {
        if np.payload_format_indicator.is_some_and(|v| v > 1) {
            return bad("payload_format_indicator is 0 or 1".into());
        }
        if np.response_topic.as_deref().is_some_and(|t| !valid_topic_name(t) || t.is_empty()) {
            return bad("response_topic is not a valid topic name".into());
        }
        properties.content_type = np.content_type.map(ByteString::from);
        properties.response_topic = np.response_topic.map(ByteString::from);
        properties.correlation_data = np.correlation_data.map(Bytes::from);
        properties.message_expiry_interval = np.message_expiry_interval;
        properties.payload_format_indicator = np.payload_format_indicator;
        properties.user_properties =
            np.user_properties.into_iter().map(|(k, v)| (ByteString::from(k), ByteString::from(v))).collect();
    }
    let packet = Publish {
        dup: false,
        qos,
        retain: p.retain,
        topic: ByteString::from(p.topic.as_str()),
        packet_id: 0,
        properties,
        payload,
    };
    let now = Instant::now();
    let msg = Message::from_publish(packet, now, 0, ByteString::from_static("$admin"));
    admin.broker.metrics().messages_received.add(qos, 1);
    let published = admin.broker.publish(msg, now);
    match settle(&admin, published, qos).await {
        Ok(reason) => Json(json!({ "topic": p.topic, "qos": p.qos, "reason": reason })).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Waits (for QoS 1 and 2, as a PUBACK would) until the message is durable and every remote
/// subscriber confirmed it; returns the reason a PUBACK would carry.
async fn settle(
    admin: &Admin,
    published: braid_broker::broker::Published,
    qos: QoS,
) -> Result<&'static str, ApiError> {
    if qos == QoS::AtMostOnce {
        return Ok(ReasonCode::Success.description());
    }
    let store = &admin.broker.store();
    let wait = async {
        if store.sync() && published.ticket > 0 {
            let mut durable = store.durable();
            if durable.wait_for(|t| *t >= published.ticket).await.is_err() {
                return ReasonCode::UnspecifiedError;
            }
        }
        for confirm in published.confirms {
            let reason = confirm.await;
            if reason.is_error() {
                return reason;
            }
        }
        ReasonCode::Success
    };
    match tokio::time::timeout(Duration::from_secs(10), wait).await {
        Ok(r) if !r.is_error() => Ok(r.description()),
        Ok(r) => Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("not accepted: {}", r.description()))),
        Err(_) => Err(ApiError(StatusCode::GATEWAY_TIMEOUT, "not confirmed within 10 s".into())),
    }
}

pub(crate) fn reported(admin: &Admin, collection: &str) -> Vec<Value> {
    admin
        .broker
        .operators()
        .reports()
        .iter()
        .filter(|r| r.collection() == collection)
        .flat_map(|r| r.entries())
        .collect()
}

async fn nodes(State(admin): Shared) -> Json<Value> {
    let mut data = reported(&admin, "nodes");
    if data.is_empty() {
        let by = &admin.broker.metrics().connected_by_transport;
        let connections: u64 = Transport::ALL.iter().map(|t| Metrics::get(by.get(*t))).sum();
        data.push(json!({
            "name": "local", "this_node": true, "state": "up", "clustered": false,
            "connections": connections, "draining": false, "drain": null,
        }));
    }
    Json(json!({ "data": data }))
}

/// Connections per second a drain or a rebalance sends away when the request names no rate,
/// and the most it may name.
const DEFAULT_RATE: u64 = 100;
const MAX_RATE: u64 = 100_000;

/// How long a rebalance may last when the request does not say, and the longest it may name.
const DEFAULT_REBALANCE_SECS: u64 = 300;
const MAX_REBALANCE_SECS: u64 = 86_400;

/// The answer to a request of a broker that is not a node of a cluster: 404 for a node other
/// than its one, `local`; 409 otherwise.
fn not_clustered(node: Option<&str>) -> Response {
    match node {
        Some(node) if node != "local" => error(
            StatusCode::NOT_FOUND,
            format!("no node is named {node:?}: this broker is not clustered (its one node is \"local\")"),
        ),
        _ => error(
            StatusCode::CONFLICT,
            "this broker is not clustered: there is no other node to move clients to",
        ),
    }
}

/// The cluster's answer to a drain or rebalance request, `status` when it was taken.
fn answered(answer: Result<Value, Refusal>, status: StatusCode) -> Response {
    match answer {
        Ok(v) => (status, Json(v)).into_response(),
        Err(Refusal::UnknownNode(m)) => error(StatusCode::NOT_FOUND, m),
        Err(Refusal::Conflict(m)) => error(StatusCode::CONFLICT, m),
        Err(Refusal::Unavailable(m)) => error(StatusCode::SERVICE_UNAVAILABLE, m),
    }
}

/// `POST /nodes/{node}/drain`, body optional: `{"rate": connections per second}`.
async fn drain(State(admin): Shared, Path(node): Path<String>, settings: Settings) -> Response {
    let [rate] = match settings.integers([("rate", 1..=MAX_RATE, DEFAULT_RATE)]) {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let Some(balancer) = admin.broker.balancer() else { return not_clustered(Some(&node)) };
    answered(balancer.drain(&node, rate as u32).await, StatusCode::ACCEPTED)
}

async fn cancel_drain(State(admin): Shared, Path(node): Path<String>) -> Response {
    let Some(balancer) = admin.broker.balancer() else { return not_clustered(Some(&node)) };
    answered(balancer.cancel_drain(&node).await, StatusCode::OK)
}

/// `POST /cluster/rebalance`, body optional: `{"rate": connections per second, "timeout_secs": the
/// longest it lasts}`.
async fn rebalance(State(admin): Shared, settings: Settings) -> Response {
    let known = [
        ("rate", 1..=MAX_RATE, DEFAULT_RATE),
        ("timeout_secs", 1..=MAX_REBALANCE_SECS, DEFAULT_REBALANCE_SECS),
    ];
    let [rate, secs] = match settings.integers(known) {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let Some(balancer) = admin.broker.balancer() else { return not_clustered(None) };
    answered(balancer.rebalance(rate as u32, Duration::from_secs(secs)).await, StatusCode::ACCEPTED)
}

async fn bridges(State(admin): Shared) -> Json<Value> {
    Json(json!({ "data": reported(&admin, "bridges") }))
}

/// Raises SIGHUP, which reloads the configuration and the files, and replies with the
/// reload's outcome: 200 with the keys changed live and those that need a restart, or 400
/// naming the problem of a configuration that was refused (the running one stays).
async fn reload(State(admin): Shared) -> Response {
    let mut reloads = admin.reloads.clone();
    let before = reloads.as_ref().map(|r| r.borrow().seq);
    if let Err(e) = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::HUP) {
        return error(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot signal this process: {e}"));
    }
    let (Some(reloads), Some(before)) = (reloads.as_mut(), before) else {
        let body = json!({ "reloading": "the files (this process reloads no configuration)" });
        return (StatusCode::ACCEPTED, Json(body)).into_response();
    };
    let done = tokio::time::timeout(Duration::from_secs(10), reloads.wait_for(|r| r.seq > before)).await;
    let outcome = match done {
        Ok(Ok(r)) => r.outcome.clone(),
        _ => return error(StatusCode::GATEWAY_TIMEOUT, "the reload did not finish within 10 s"),
    };
    match outcome {
        Ok(v) => Json(v).into_response(),
        Err(e) => error(
            StatusCode::BAD_REQUEST,
            format!("the new configuration is refused, the running one stays: {e}"),
        ),
    }
}

/// `POST /traces`: one of `client_id` and `topic`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTrace {
    name: String,
    client_id: Option<String>,
    topic: Option<String>,
    #[serde(default = "default_trace_secs")]
    duration_secs: u64,
}

fn default_trace_secs() -> u64 {
    300
}

/// The longest a trace runs.
const MAX_TRACE_SECS: u64 = 24 * 3600;

fn trace_json(t: &Trace, now: Instant) -> Value {
    let (kind, target) = match &t.target {
        Target::Client(id) => ("client", id.as_str()),
        Target::Topic(filter) => ("topic", filter.as_str()),
    };
    json!({
        "name": t.name,
        "type": kind,
        "target": target,
        "path": t.path.display().to_string(),
        "packets": t.packets.load(std::sync::atomic::Ordering::Relaxed),
        "dropped": t.dropped.load(std::sync::atomic::Ordering::Relaxed),
        "remaining_secs": t.until.saturating_duration_since(now).as_secs(),
    })
}

async fn traces(State(admin): Shared) -> Json<Value> {
    let now = Instant::now();
    let data: Vec<Value> = admin.broker.tracer().list().iter().map(|t| trace_json(t, now)).collect();
    Json(json!({ "data": data }))
}

async fn start_trace(State(admin): Shared, Body(t): Body<NewTrace>) -> Response {
    let bad = |m: String| error(StatusCode::BAD_REQUEST, m);
    let name_ok = t.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if t.name.is_empty() || t.name.len() > 64 || !name_ok {
        return bad("name is 1 to 64 letters, digits, '-', '_' or '.'".into());
    }
    let target = match (t.client_id, t.topic) {
        (Some(id), None) if !id.is_empty() => Target::Client(id),
        (None, Some(filter)) if valid_topic_filter(&filter) => Target::Topic(filter),
        (None, Some(filter)) => return bad(format!("{filter:?} is not a valid topic filter")),
        _ => return bad("give one of client_id and topic".into()),
    };
    if !(1..=MAX_TRACE_SECS).contains(&t.duration_secs) {
        return bad(format!("duration_secs is 1 to {MAX_TRACE_SECS}"));
    }
    let config = &admin.broker.config();
    let dir = config.admin.trace_dir.clone().unwrap_or_else(|| config.store.data_dir.join("traces"));
    let now = Instant::now();
    let until = now + Duration::from_secs(t.duration_secs);
    let trace = match admin.broker.tracer().start(&t.name, target, &dir, until) {
        Ok(trace) => trace,
        Err(e) if e.contains("is running") => return error(StatusCode::CONFLICT, e),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot write the trace: {e}")),
    };
    tracing::info!(trace = %t.name, path = %trace.path.display(), "packet trace started (API)");
    let (broker, started) = (admin.broker.clone(), trace.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep_until(until.into()) => {}
            _ = broker.shutdown().cancelled() => {}
        }
        // Stopped here unless stopped (and maybe started again under its name) before.
        if broker.tracer().list().iter().any(|t| Arc::ptr_eq(t, &started)) {
            broker.tracer().stop(&started.name);
        }
    });
    (StatusCode::CREATED, Json(trace_json(&trace, now))).into_response()
}

async fn stop_trace(State(admin): Shared, Path(name): Path<String>) -> Response {
    match admin.broker.tracer().stop(&name) {
        Some(t) => Json(trace_json(&t, Instant::now())).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no trace named {name:?} is running")),
    }
}

/// The file of a running trace, as it is now.
async fn trace_log(State(admin): Shared, Path(name): Path<String>) -> Response {
    let Some(t) = admin.broker.tracer().list().into_iter().find(|t| t.name == name) else {
        return error(StatusCode::NOT_FOUND, format!("no trace named {name:?} is running"));
    };
    match tokio::fs::read_to_string(&t.path).await {
        Ok(text) => ([(axum::http::header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("{}: {e}", t.path.display())),
    }
}
