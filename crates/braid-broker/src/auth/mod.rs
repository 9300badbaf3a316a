//! Authentication and authorization: who may connect, and which topics each client may
//! publish and subscribe to. The model and the files' formats are in `docs/security.md`.
//!
//! Authentication runs once per CONNECT, before the session is touched, and tries in order:
//! an identity the transport already verified (a TLS client certificate), anonymous access,
//! the password file, a JWT in the password field, the HTTP hook. Authorization is compiled
//! per connection ([`ConnectionAcl`]), so the publish path pays one atomic load when no ACL is
//! configured and a cached lookup when one is.

pub mod acl;
mod file;
pub mod http;
pub mod jwt;
pub mod password;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::{Mutex, RwLock};
use tokio::sync::Semaphore;
use tracing::{error, info, warn};

use braid_proto::{Connect, ReasonCode};

use crate::config::{AclPolicy, Config, ConfigError};
use acl::{AclRules, ClientAcl};
pub use file::{load_file, save_private, FileError, LineError};
use http::HttpHook;
use jwt::{AclClaim, JwtVerifier};
use password::PasswordFile;

/// Who a connection is, as authentication established it.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    /// The user name (None: anonymous).
    pub username: Option<String>,
    /// An ACL that came with the credentials (token claim or HTTP hook reply); it replaces the
    /// rules file for this client.
    pub acl: Option<AclClaim>,
}

impl Identity {
    /// A part of Braid connected in process (see [`crate::connection::in_process`]), named
    /// `name`: it may publish and subscribe to any topic, whatever the rules file says.
    pub fn unrestricted(name: &str) -> Identity {
        let all = vec!["#".to_string()];
        Identity {
            username: Some(name.to_string()),
            acl: Some(AclClaim { publish: all.clone(), subscribe: all }),
        }
    }
}

/// Why a CONNECT was refused: the CONNACK reason and a line for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// CONNACK reason (v5 0x86/0x87; 3.1.x return codes 4/5).
    pub reason: ReasonCode,
    /// What went wrong, for the log (never sent to the client).
    pub detail: String,
}

fn refuse(reason: ReasonCode, detail: impl Into<String>) -> Refusal {
    Refusal { reason, detail: detail.into() }
}

/// Size and modification time of a watched file.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    std::fs::metadata(path).ok().and_then(|m| Some((m.modified().ok()?, m.len())))
}

/// The broker's authentication methods and ACL rules; the files reload when they change.
#[derive(Debug)]
pub struct Security {
    allow_anonymous: bool,
    password_file: Option<PathBuf>,
    passwords: RwLock<Arc<PasswordFile>>,
    acl_file: Option<PathBuf>,
    default_allow: bool,
    rules: RwLock<Option<Arc<AclRules>>>,
    /// Bumped whenever the rules change, so connections rebuild their compiled ACL.
    rules_generation: AtomicU64,
    jwt: Option<JwtVerifier>,
    http: Option<HttpHook>,
    /// Bounds concurrent password hashing (each is CPU- and memory-hungry).
    hashing: Semaphore,
    stamps: Mutex<(Stamp, Stamp)>,
    /// Reads of the password and ACL files, loaded or refused (see [`Security::file_reads`]).
    reads: AtomicU64,
}

impl Security {
    /// Checks that every file and URL `config` names for authentication and authorization
    /// loads, naming the key and the problem otherwise. [`crate::Server::bind`] runs it before
    /// anything starts.
    pub fn check(config: &Config) -> Result<(), ConfigError> {
        let a = &config.auth;
        if let Some(path) = &a.password_file {
            PasswordFile::load(path).map_err(|e| ConfigError::invalid("auth.password_file", e))?;
        }
        if let Some(path) = &a.jwt_key_file {
            JwtVerifier::load(&a.jwt_algorithm, path, &a.jwt_acl_claim)
                .map_err(|e| ConfigError::invalid("auth.jwt_key_file", e))?;
        }
        if let Some(url) = &a.http_url {
            HttpHook::new(url, Duration::from_millis(a.http_timeout_ms))
                .map_err(|e| ConfigError::invalid("auth.http_url", e))?;
        }
        if let Some(path) = &config.acl.file {
            AclRules::load(path, true).map_err(|e| ConfigError::invalid("acl.file", e))?;
        }
        Ok(())
    }

    /// Loads what `config` names. A file that fails to load ([`crate::Server::bind`] checks
    /// the configuration with [`Security::check`] first, so there only a race gets here) fails
    /// closed: no users, no topics.
    pub fn new(config: &Config) -> Security {
        let a = &config.auth;
        let jwt = a.jwt_key_file.as_ref().and_then(|path| {
            JwtVerifier::load(&a.jwt_algorithm, path, &a.jwt_acl_claim)
                .map_err(|e| error!("auth.jwt_key_file: {e}; JWT authentication is off"))
                .ok()
        });
        let http = a.http_url.as_ref().and_then(|url| {
            HttpHook::new(url, Duration::from_millis(a.http_timeout_ms))
                .map_err(|e| error!("auth.http_url: {e}; the HTTP hook is off"))
                .ok()
        });
        let hashers = std::thread::available_parallelism().map_or(1, |n| n.get());
        let security = Security {
            allow_anonymous: a.allow_anonymous,
            password_file: a.password_file.clone(),
            passwords: RwLock::default(),
            acl_file: config.acl.file.clone(),
            default_allow: config.acl.default_policy == AclPolicy::Allow,
            rules: RwLock::new(None),
            rules_generation: AtomicU64::new(0),
            jwt,
            http,
            hashing: Semaphore::new(hashers),
            stamps: Mutex::new((None, None)),
            reads: AtomicU64::new(0),
        };
        if security.acl_file.is_some() {
            // Until the file loads, nothing is allowed.
            *security.rules.write() = Some(Arc::new(AclRules::parse("", false).expect("empty rules")));
        }
        security.reload(true);
        security
    }

    /// Says at startup which methods are on (and, clearly, whether anonymous clients may connect).
    pub fn log_startup(&self) {
        if self.allow_anonymous {
            warn!("anonymous clients may connect (auth.allow_anonymous = true)");
        } else {
            info!("anonymous clients are refused (auth.allow_anonymous = false)");
        }
        let mut methods = Vec::new();
        if let Some(p) = &self.password_file {
            methods.push(format!("password file {} ({} users)", p.display(), self.passwords.read().len()));
        }
        if self.jwt.is_some() {
            methods.push("JWT".into());
        }
        if self.http.is_some() {
            methods.push("HTTP hook".into());
        }
        if !methods.is_empty() {
            info!("authentication: {}", methods.join(", "));
        }
        match &self.acl_file {
            Some(p) => info!(
                "ACL rules from {}, default {}",
                p.display(),
                if self.default_allow { "allow" } else { "deny" }
            ),
            None => info!("no ACL file: every client may use every topic (except publishing under $SYS)"),
        }
    }

    /// Re-reads the password and ACL files: every file when `force` (SIGHUP), else those whose
    /// size or modification time changed. A file that no longer parses is reported and the
    /// previous contents stay in force.
    pub fn reload(&self, force: bool) {
        let mut stamps = self.stamps.lock();
        if let Some(path) = &self.password_file {
            let now = stamp(path);
            if force || now != stamps.0 {
                stamps.0 = now;
                match PasswordFile::load(path) {
                    Ok(f) => {
                        if !force {
                            info!("password file {} reloaded: {} users", path.display(), f.len());
                        }
                        *self.passwords.write() = Arc::new(f);
                    }
                    Err(e) => error!("auth.password_file: {e}; keeping the previous users"),
                }
                // After the outcome is in force: see `file_reads`.
                self.reads.fetch_add(1, Ordering::Release);
            }
        }
        if let Some(path) = &self.acl_file {
            let now = stamp(path);
            if force || now != stamps.1 {
                stamps.1 = now;
                match AclRules::load(path, self.default_allow) {
                    Ok(r) => {
                        if !force {
                            info!("ACL file {} reloaded", path.display());
                        }
                        *self.rules.write() = Some(Arc::new(r));
                        self.rules_generation.fetch_add(1, Ordering::Release);
                    }
                    Err(e) => error!("acl.file: {e}; keeping the previous rules"),
                }
                self.reads.fetch_add(1, Ordering::Release);
            }
        }
    }

    /// How many times [`Security::reload`] has read the password or ACL file (at start, on
    /// SIGHUP, after a change), whether the file loaded or was refused: once it has moved past
    /// a change, that change is in force or was reported (what a test waits on, not the clock).
    pub fn file_reads(&self) -> u64 {
        self.reads.load(Ordering::Acquire)
    }

    /// Authenticates a CONNECT. `verified_username` is an identity the transport established
    /// (the TLS client certificate's name): it is the user name, whatever the packet says.
    pub async fn authenticate(
        &self,
        c: &Connect,
        verified_username: Option<&str>,
    ) -> Result<Identity, Refusal> {
        if let Some(name) = verified_username {
            return Ok(Identity { username: Some(name.to_string()), acl: None });
        }
        let username = c.username.as_deref();
        let password = c.password.as_deref();
        if username.is_none() && password.is_none() {
            return if self.allow_anonymous {
                Ok(Identity::default())
            } else {
                Err(refuse(ReasonCode::NotAuthorized, "anonymous clients are not allowed"))
            };
        }
        let passwords = self.passwords.read().clone();
        if let Some(user) = username.filter(|u| passwords.contains(u)) {
            return self.check_password(passwords, user, password.unwrap_or_default()).await;
        }
        if let (Some(jwt), Some(token)) = (&self.jwt, password.filter(|p| JwtVerifier::looks_like_token(p))) {
            let claims = jwt
                .verify(token)
                .map_err(|e| refuse(ReasonCode::BadUserNameOrPassword, format!("JWT: {e}")))?;
            let username = match (claims.subject, username) {
                (Some(sub), Some(user)) if sub != user => {
                    return Err(refuse(
                        ReasonCode::BadUserNameOrPassword,
                        format!("JWT: user name {user:?} is not the token's subject {sub:?}"),
                    ))
                }
                (sub, user) => sub.or(user.map(str::to_string)),
            };
            return Ok(Identity { username, acl: claims.acl });
        }
        if let Some(hook) = &self.http {
            let reply = hook.ask(&c.client_id, username, password).await.map_err(|e| {
                warn!(client_id = %c.client_id, "HTTP auth hook failed, denying: {e}");
                refuse(ReasonCode::NotAuthorized, format!("HTTP auth hook: {e}"))
            })?;
            return match reply.result.as_str() {
                "allow" => Ok(Identity { username: username.map(str::to_string), acl: reply.acl }),
                _ => Err(refuse(ReasonCode::BadUserNameOrPassword, "HTTP auth hook denied the credentials")),
            };
        }
        if self.password_file.is_some() || self.jwt.is_some() {
            return Err(refuse(ReasonCode::BadUserNameOrPassword, "unknown user or credentials"));
        }
        if self.allow_anonymous {
            // No method checks credentials: the user name is taken as given.
            Ok(Identity { username: username.map(str::to_string), acl: None })
        } else {
            Err(refuse(ReasonCode::NotAuthorized, "no authentication method is configured"))
        }
    }

    async fn check_password(
        &self,
        file: Arc<PasswordFile>,
        user: &str,
        password: &[u8],
    ) -> Result<Identity, Refusal> {
        let busy = refuse(ReasonCode::ServerUnavailable, "password check unavailable");
        let _permit = self.hashing.acquire().await.map_err(|_| busy.clone())?;
        let (u, p) = (user.to_string(), password.to_vec());
        // Argon2 takes tens of milliseconds of CPU: off the async workers.
        let ok = tokio::task::spawn_blocking(move || file.verify(&u, &p)).await.map_err(|_| busy)?;
        match ok {
            Some(true) => Ok(Identity { username: Some(user.to_string()), acl: None }),
            _ => Err(refuse(ReasonCode::BadUserNameOrPassword, format!("wrong password for user {user:?}"))),
        }
    }

    /// What a connection of `client_id` with `identity` carries for its topic checks (see
    /// [`Security::resume_acl`]); None for an anonymous client without an ACL of its own.
    pub fn seed(&self, identity: Identity, client_id: &str) -> Option<Box<AclSeed>> {
        let fixed = identity.acl.map(|claim| {
            Arc::new(ClientAcl::allow_list(
                &claim.publish,
                &claim.subscribe,
                identity.username.as_deref(),
                client_id,
            ))
        });
        AclSeed::new(identity.username, fixed)
    }

    /// The topic checks for a connection with `seed` (new, or back from parking).
    pub fn resume_acl(&self, seed: Option<Box<AclSeed>>, client_id: &str) -> ConnectionAcl<'_> {
        let (username, fixed) = seed.map_or((None, None), |s| (s.username, s.fixed));
        let mut c = ConnectionAcl {
            security: self,
            generation: u64::MAX,
            fixed: fixed.is_some(),
            acl: fixed,
            cache: HashMap::new(),
            username,
            client_id: client_id.to_string(),
        };
        c.refresh();
        c
    }
}

/// What a parked connection keeps of its authorization: who the client is and any ACL that came
/// with its credentials. The rules and the verdict cache are rebuilt when it resumes.
#[derive(Debug, Clone)]
pub struct AclSeed {
    username: Option<String>,
    fixed: Option<Arc<ClientAcl>>,
}

impl AclSeed {
    /// None when there is nothing to keep (anonymous, no ACL of its own).
    fn new(username: Option<String>, fixed: Option<Arc<ClientAcl>>) -> Option<Box<AclSeed>> {
        (username.is_some() || fixed.is_some()).then(|| Box::new(AclSeed { username, fixed }))
    }
}

/// Checks at most this many distinct topics per connection before the cache starts over.
const CACHE_LIMIT: usize = 1024;

/// One connection's topic authorization: its compiled rules and a cache of publish verdicts.
/// Rebuilt when the rules file reloads.
#[derive(Debug)]
pub struct ConnectionAcl<'a> {
    security: &'a Security,
    generation: u64,
    /// None: no ACL applies (everything allowed).
    acl: Option<Arc<ClientAcl>>,
    cache: HashMap<Box<str>, bool>,
    /// The ACL came with the credentials; the rules file does not apply.
    fixed: bool,
    username: Option<String>,
    client_id: String,
}

impl ConnectionAcl<'_> {
    /// What to keep while the connection is parked; None for an anonymous client without an
    /// ACL of its own (nothing to keep).
    pub fn into_seed(self) -> Option<Box<AclSeed>> {
        AclSeed::new(self.username, if self.fixed { self.acl } else { None })
    }

    fn refresh(&mut self) {
        if self.fixed {
            return;
        }
        let now = self.security.rules_generation.load(Ordering::Acquire);
        if now != self.generation {
            self.generation = now;
            self.cache.clear();
            self.acl = self
                .security
                .rules
                .read()
                .as_ref()
                .map(|r| Arc::new(r.for_client(self.username.as_deref(), &self.client_id)));
        }
    }

    /// The client's user name, if it gave one.
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// May this connection publish to `topic`?
    pub fn may_publish(&mut self, topic: &str) -> bool {
        self.refresh();
        let Some(acl) = &self.acl else { return true };
        if let Some(&ok) = self.cache.get(topic) {
            return ok;
        }
        let ok = acl.may_publish(topic);
        if self.cache.len() >= CACHE_LIMIT {
            self.cache.clear();
        }
        self.cache.insert(topic.into(), ok);
        ok
    }

    /// May this connection subscribe to `filter` (a shared subscription's inner filter)?
    pub fn may_subscribe(&mut self, filter: &str) -> bool {
        self.refresh();
        match &self.acl {
            None => true,
            Some(acl) => acl.may_subscribe(filter),
        }
    }
}
