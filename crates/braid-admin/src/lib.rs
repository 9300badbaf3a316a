//! Braid's HTTP admin listener (`listeners.http`): Prometheus metrics at `/metrics`, the REST
//! API under `/api/v1` (see `docs/api.md` and `docs/openapi.json`) and the web dashboard at
//! `/`, served by axum on the broker's runtime.
//!
//! - [`keys`]: the API keys file and `braid apikey`.
//! - `prom`: the metrics in the Prometheus text format.
//! - `api`: the REST API.
//! - `dashboard`: the dashboard's pages, embedded in the binary.
//!
//! With `admin.api_keys_file` set, every request but `GET /api/v1/health` carries a key, as
//! `Authorization: Bearer KEY` or as basic auth (user: the key's name, password: the key).

pub mod keys;

mod api;
mod dashboard;
mod prom;
mod rules;
mod sinks;

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use base64::Engine;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tracing::{info, warn};

use braid_broker::rule_book::RuleBook;
use braid_broker::transport::tls::Reloadable;
use braid_broker::transport::Transport;
use braid_broker::Broker;

use keys::ApiKeys;

/// The outcome of a configuration reload (SIGHUP), as the process announces it: numbered from
/// 1, with the changes applied (a JSON object) or why the new configuration was refused.
#[derive(Debug, Clone)]
pub struct Reloaded {
    /// Which reload this was (0: none yet).
    pub seq: u64,
    /// What it changed, or why it was refused.
    pub outcome: Result<serde_json::Value, String>,
}

/// What the API shares: the broker, the keys, the MQTT listeners' addresses.
#[derive(Debug)]
pub(crate) struct Admin {
    pub(crate) broker: Arc<Broker>,
    /// The rules and sinks in force, and where each is defined (`/api/v1/rules`, `/sinks`).
    pub(crate) book: Arc<RuleBook>,
    /// The API keys, when `admin.api_keys_file` is set; read again on SIGHUP.
    pub(crate) keys: Option<RwLock<ApiKeys>>,
    pub(crate) listeners: Vec<(Transport, SocketAddr)>,
    pub(crate) http: SocketAddr,
    /// The outcomes of reloads, when the process reloads its configuration on SIGHUP.
    pub(crate) reloads: Option<tokio::sync::watch::Receiver<Reloaded>>,
}

/// What the error of a `listeners.http` address in use adds: what to do about it.
const ADDR_IN_USE_HINT: &str = "; another broker on this machine? Set listeners.http to another \
     address (--set listeners.http=127.0.0.1:0 takes a free port) or to \"\" to turn the admin \
     listener off (--set 'listeners.http=\"\"')";

/// The admin listener, bound, ready to run.
#[derive(Debug)]
pub struct AdminListener {
    tcp: TcpListener,
    tls: Option<Arc<Reloadable>>,
    admin: Arc<Admin>,
}

impl AdminListener {
    /// Binds `listeners.http` (None if it is `""`) and loads the API keys and, with
    /// `admin.tls`, the certificate. `mqtt` lists the MQTT listeners (for `/api/v1/listeners`);
    /// `reloads` announces the outcome of each SIGHUP's reload (`POST /api/v1/reload` raises
    /// one and replies with it); `book` holds the rules and sinks the API lists and changes. A
    /// keys file or certificate that does not load is an `InvalidInput` error naming it.
    pub async fn bind(
        broker: &Arc<Broker>,
        book: Arc<RuleBook>,
        mqtt: Vec<(Transport, SocketAddr)>,
        reloads: Option<tokio::sync::watch::Receiver<Reloaded>>,
    ) -> io::Result<Option<AdminListener>> {
        let config = &broker.config();
        let Some(addr) = config.listeners.http else { return Ok(None) };
        let invalid = |key: &str, e: &dyn std::fmt::Display| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{key}: {e}"))
        };
        let keys = match &config.admin.api_keys_file {
            Some(path) => {
                Some(RwLock::new(ApiKeys::load(path).map_err(|e| invalid("admin.api_keys_file", &e))?))
            }
            None => None,
        };
        let tls = match config.admin.tls {
            true => Some(Reloadable::load(&config.tls).map_err(|e| invalid("admin.tls", &e))?),
            false => None,
        };
        let tcp = TcpListener::bind(addr).await.map_err(|e| {
            // Most often a second broker on the same machine, on the default address.
            let hint = match e.kind() {
                io::ErrorKind::AddrInUse => ADDR_IN_USE_HINT,
                _ => "",
            };
            io::Error::new(e.kind(), format!("listeners.http: cannot listen on {addr}: {e}{hint}"))
        })?;
        let http = tcp.local_addr()?;
        let admin = Arc::new(Admin { broker: broker.clone(), book, keys, listeners: mqtt, http, reloads });
        Ok(Some(AdminListener { tcp, tls, admin }))
    }

    /// The address it is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.admin.http
    }

    /// Serves until the broker shuts down.
    pub async fn run(self) {
        let broker = self.admin.broker.clone();
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        info!(addr = %self.admin.http, scheme, "listening for HTTP (metrics, API, dashboard)");
        if self.admin.keys.is_none() {
            info!(
                "the HTTP admin listener asks for no API key (admin.api_keys_file is not set; loopback only)"
            );
        }
        if let Some(tls) = &self.tls {
            tokio::spawn(tls.clone().watch(broker.shutdown().clone()));
        }
        if self.admin.keys.is_some() {
            tokio::spawn(reload_keys_on_sighup(self.admin.clone()));
        }
        let app = router(self.admin.clone());
        loop {
            let (stream, peer) = tokio::select! {
                accepted = self.tcp.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        warn!("HTTP admin listener: accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = broker.shutdown().cancelled() => return,
            };
            let (app, tls, shutdown) = (app.clone(), self.tls.clone(), broker.shutdown().clone());
            tokio::spawn(async move {
                let service = TowerToHyperService::new(app);
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let served = match tls {
                    Some(tls) => match tokio_rustls::TlsAcceptor::from(tls.current()).accept(stream).await {
                        Ok(s) => {
                            let conn = builder.serve_connection(TokioIo::new(s), service);
                            tokio::select! { r = conn => r, _ = shutdown.cancelled() => Ok(()) }
                        }
                        Err(e) => {
                            return tracing::debug!(%peer, "HTTP admin listener: TLS handshake failed: {e}")
                        }
                    },
                    None => {
                        let conn = builder.serve_connection(TokioIo::new(stream), service);
                        tokio::select! { r = conn => r, _ = shutdown.cancelled() => Ok(()) }
                    }
                };
                if let Err(e) = served {
                    tracing::debug!(%peer, "HTTP admin connection: {e}");
                }
            });
        }
    }
}

/// Reads the API keys file again on every SIGHUP; a file that does not load leaves the keys
/// as they were.
async fn reload_keys_on_sighup(admin: Arc<Admin>) {
    let (Some(keys), Some(path)) = (&admin.keys, &admin.broker.config().admin.api_keys_file) else { return };
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else { return };
    loop {
        tokio::select! {
            got = hup.recv() => if got.is_none() { return },
            _ = admin.broker.shutdown().cancelled() => return,
        }
        match ApiKeys::load(path) {
            Ok(new) => {
                *keys.write().unwrap_or_else(|e| e.into_inner()) = new;
                info!(file = %path.display(), "API keys reloaded (SIGHUP)");
            }
            Err(e) => warn!("API keys not reloaded, keeping the old ones: {e}"),
        }
    }
}

/// Every route, behind the API key check.
fn router(admin: Arc<Admin>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .nest("/api/v1", api::routes())
        .merge(dashboard::routes())
        .fallback(|| async {
            api::error(StatusCode::NOT_FOUND, "no such page: the API is under /api/v1 (see docs/api.md)")
        })
        .method_not_allowed_fallback(|| async {
            api::error(StatusCode::METHOD_NOT_ALLOWED, "this method is not allowed here (see docs/api.md)")
        })
        .layer(axum::middleware::from_fn_with_state(admin.clone(), authenticate))
        .layer(axum::extract::DefaultBodyLimit::max(admin.broker.config().admin.max_body_bytes))
        .with_state(admin)
}

async fn metrics(State(admin): State<Arc<Admin>>) -> Response {
    let text = prom::render(&admin.broker, Instant::now());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// Lets a request through if no keys are configured, if it is the health check, or if it
/// carries a valid key; else 401 with a JSON error.
async fn authenticate(State(admin): State<Arc<Admin>>, request: Request, next: Next) -> Response {
    let Some(keys) = &admin.keys else { return next.run(request).await };
    if request.uri().path() == "/api/v1/health" || dashboard::is_public(request.uri().path()) {
        return next.run(request).await;
    }
    let given = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let ok = given.is_some_and(|value| key_valid(&keys.read().unwrap_or_else(|e| e.into_inner()), value));
    if ok {
        return next.run(request).await;
    }
    let mut response = api::error(
        StatusCode::UNAUTHORIZED,
        match given {
            Some(_) => "the API key is not valid",
            None => {
                "an API key is required: Authorization: Bearer KEY (or basic auth, user = the key's name)"
            }
        },
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer realm=\"braid\""));
    response
}

/// True if an `Authorization` header's value carries one of `keys`.
fn key_valid(keys: &ApiKeys, value: &str) -> bool {
    match value.split_once(' ') {
        Some((scheme, key)) if scheme.eq_ignore_ascii_case("bearer") => {
            keys.check(key.trim(), None).is_some()
        }
        Some((scheme, encoded)) if scheme.eq_ignore_ascii_case("basic") => {
            let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok();
            let text = decoded.and_then(|d| String::from_utf8(d).ok());
            text.and_then(|t| t.split_once(':').map(|(n, k)| keys.check(k, Some(n)).is_some()))
                .unwrap_or(false)
        }
        _ => false,
    }
}
