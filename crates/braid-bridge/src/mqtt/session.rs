//! A bridge's run. A session opens the bridge's side in Braid first (so its outbox exists and
//! queues while the remote is away), subscribes it to the `out` lines' local topics, connects
//! to the remote (trying again with a growing pause, up to `restart_timeout_secs`), subscribes
//! there to the `in` lines' remote topics, and then pumps both ways:
//!
//! - **out**: each message the outbox hands over is published on the remote under the first
//!   `out` line that maps its topic, at the lower of its QoS and the line's, RETAIN as
//!   published; the outbox gets its PUBACK once the remote acknowledged it (QoS 1/2).
//! - **in**: each message from the remote is published in Braid under the first `in` line that
//!   maps its topic; the remote gets its PUBACK (QoS 2: PUBREC) once Braid acknowledged it.
//!
//! Over TCP, TLS and WebSocket the remote connection reconnects by itself (braid-client's
//! reconnect): the remote session resumes (or the subscriptions are made again if the remote
//! lost it), what the remote had not acknowledged is sent again in order (same packet ids,
//! DUP: QoS 2 stays exactly once), and the outbox waits meanwhile. Over QUIC data streams end
//! with their connection, so a lost connection ends the session: the bridge's side in Braid is
//! closed too, and the next session gets again, in order, what the remote had not
//! acknowledged (at least once). A session ends too if Braid closes the bridge's connection.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use braid_broker::message::Message as Internal;
use braid_client::{
    Client, Connected, Error, Event, Message, Properties, Publish, PublishHandle, QoS, ReasonCode,
    RetainHandling, SubscriptionOptions,
};
use braid_proto::{ByteString, Bytes};

use super::remote::{self, Remote, FIRST_BACKOFF};
use super::Bridge;
use crate::stats::{bump, drop_one, Stats};
use braid_client::Backoff;

/// Unacknowledged QoS 1/2 messages each way: the Receive Maximum the bridge announces on
/// both sides and the most it sends before an acknowledgement (the remote's own Receive
/// Maximum may be lower). Below braid-client's event queue (1,024), so that what is
/// unacknowledged always fits in it.
const WINDOW: u16 = 512;
/// How long closing a connection may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// A session that lasted this long starts the next one after the first pause again.
const STEADY: Duration = Duration::from_secs(30);

/// The id of bridge `name`'s client in Braid among the bridges' in-process clients.
pub(super) fn local_id(name: &str) -> String {
    format!("mqtt/{name}")
}

/// Why a session ended.
enum Ended {
    Shutdown,
    /// Start again after a pause.
    Retry(String),
}

/// Runs bridge `b` until the broker shuts down.
pub(super) async fn run(b: Arc<Bridge>) {
    let mut backoff = b.backoff();
    loop {
        let started = Instant::now();
        let Ended::Retry(why) = session(&b).await else { return };
        b.went_down(&why);
        if started.elapsed() > STEADY {
            backoff.reset();
        }
        debug!(bridge = %b.config.name, "mqtt bridge: {why}; starting again in {} ms", backoff.next().as_millis());
        if !crate::pause(&mut backoff, &b.stop).await {
            return;
        }
    }
}

/// One session: the bridge's connection in Braid, then the remote's.
async fn session(b: &Arc<Bridge>) -> Ended {
    if b.stop.is_cancelled() {
        return Ended::Shutdown;
    }
    let id = local_id(&b.config.name);
    let (local, connected) = match crate::connect(&b.broker, &id, b.limits.clone(), WINDOW).await {
        Ok(c) => c,
        Err(e) => return Ended::Retry(format!("cannot open the bridge's session in Braid: {e}")),
    };
    let ended = match subscribe_local(b, &local, &connected.client_id).await {
        Ok(()) => with_local(b, &local).await,
        Err(why) => Ended::Retry(why),
    };
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, local.disconnect(ReasonCode::Success)).await;
    ended
}

/// The rest of a session, once the bridge's side in Braid is subscribed.
async fn with_local(b: &Arc<Bridge>, local: &Client) -> Ended {
    let Some((main, connected)) = connect_remote(b).await else { return Ended::Shutdown };
    let remote = match Remote::open(b, main.clone()).await {
        Ok(r) => r,
        Err(e) => {
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, main.disconnect(ReasonCode::Success)).await;
            return Ended::Retry(format!("cannot open the QUIC data streams: {e}"));
        }
    };
    let ended = pump(b, local, &remote, &connected).await;
    for client in remote.streams.iter().flatten().chain([&remote.main]) {
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, client.disconnect(ReasonCode::Success)).await;
    }
    ended
}

/// Connects to the remote, trying again after a growing pause until it answers; None if the
/// broker shuts down first.
async fn connect_remote(b: &Bridge) -> Option<(Client, Connected)> {
    let opts = remote::options(b, WINDOW);
    let mut backoff = b.backoff();
    loop {
        tokio::select! {
            connected = Client::connect(opts.clone()) => match connected {
                Ok(c) => return Some(c),
                Err(e) => b.went_down(&format!("cannot connect to {} ({}): {e}", b.config.address, b.config.transport)),
            },
            _ = b.stop.cancelled() => return None,
        }
        if !crate::pause(&mut backoff, &b.stop).await {
            return None;
        }
    }
}

/// Subscribes the bridge's session in Braid to the `out` lines' local topics (No Local: what
/// the bridge brings in does not go back out; Retain As Published; no retained messages at
/// subscribe, the bridge carries what is published), and unsubscribes it from topics no line
/// has any more (the configuration changed).
async fn subscribe_local(b: &Bridge, local: &Client, client_id: &str) -> Result<(), String> {
    let mut filters: Vec<(String, QoS)> = Vec::new();
    for line in b.lines.iter().filter(|l| l.outgoing()) {
        let filter = line.local_filter();
        match filters.iter_mut().find(|(f, _)| *f == filter) {
            Some((_, qos)) => *qos = (*qos).max(line.qos),
            None => filters.push((filter, line.qos)),
        }
    }
    let keep: Vec<&str> = filters.iter().map(|(f, _)| f.as_str()).collect();
    crate::leave_stale(&b.broker, local, client_id, &keep).await?;
    for (filter, qos) in filters {
        let opts = SubscriptionOptions {
            qos,
            no_local: true,
            retain_as_published: true,
            retain_handling: RetainHandling::DoNotSend,
        };
        match local.subscribe(vec![(filter.clone(), opts)], Properties::default()).await {
            Ok(codes) if codes.iter().all(|c| !c.is_error()) => {}
            Ok(codes) => return Err(format!("Braid refused the subscription to {filter:?}: {codes:?}")),
            Err(e) => return Err(format!("cannot subscribe in Braid to {filter:?}: {e}")),
        }
    }
    Ok(())
}

/// Subscribes on the remote to the `in` lines' remote topics (over QUIC each on its line's
/// stream), No Local and Retain As Published when the remote speaks MQTT 5. In a cluster an
/// `in` line's subscription is shared by the nodes (`$share/braid-<name>/...`): each message
/// comes into the cluster once, through one of them (a `both` line's cannot be shared: No Local,
/// which keeps it from looping, is not allowed on a shared subscription). A subscription the
/// remote refuses is logged, and the others go on.
async fn subscribe_remote(b: &Bridge, remote: &Remote) -> Result<(), String> {
    let v5 = remote::version(&b.config.protocol_version).is_some_and(|v| v.is_v5());
    let cluster = b.broker.config().cluster.enabled;
    for (i, line) in b.lines.iter().enumerate().filter(|(_, l)| l.incoming()) {
        let shared = cluster && !line.outgoing();
        let filter = match shared {
            true => format!("$share/braid-{}/{}", b.config.name, line.remote_filter()),
            false => line.remote_filter(),
        };
        let opts = SubscriptionOptions {
            qos: line.qos,
            no_local: v5 && !shared,
            retain_as_published: v5,
            retain_handling: RetainHandling::SendAtSubscribe,
        };
        match remote.for_line(i).subscribe(vec![(filter.clone(), opts)], Properties::default()).await {
            Ok(codes) if codes.iter().all(|c| !c.is_error()) => {}
            Ok(codes) => {
                warn!(bridge = %b.config.name, "mqtt bridge: the remote refused the subscription to {filter:?}: {codes:?}")
            }
            Err(e) => return Err(format!("cannot subscribe on the remote to {filter:?}: {e}")),
        }
    }
    Ok(())
}

/// Runs the pumps until one of them ends or the broker shuts down, and meanwhile subscribes on
/// the remote (the pumps run already: what the remote sends before its SUBACK is taken) and
/// says the bridge is up once it is subscribed there.
async fn pump(b: &Arc<Bridge>, local: &Client, remote: &Remote, connected: &Connected) -> Ended {
    let mut tasks = JoinSet::new();
    tasks.spawn(out_pump(b.clone(), local.clone(), remote.clone()));
    tasks.spawn(in_pump(b.clone(), remote.main.clone(), local.clone(), true));
    for (stream, line) in remote.streams.iter().zip(&b.lines) {
        if let (Some(stream), true) = (stream, line.incoming()) {
            tasks.spawn(in_pump(b.clone(), stream.clone(), local.clone(), false));
        }
    }
    let ready = async {
        match subscribe_remote(b, remote).await {
            Ok(()) => {
                b.came_up(connected);
                std::future::pending().await
            }
            Err(why) => Ended::Retry(why),
        }
    };
    let ended = tokio::select! {
        ended = ready => ended,
        done = tasks.join_next() => match done {
            Some(Ok(ended)) => ended,
            Some(Err(e)) => Ended::Retry(format!("a bridge task failed: {e}")),
            None => Ended::Retry("no bridge task".into()),
        },
        _ = b.stop.cancelled() => Ended::Shutdown,
    };
    tasks.shutdown().await;
    ended
}

/// Counts a message handed to the remote in `out/inflight` until its acknowledgement, and in
/// `out/failed` if its session ends first (the outbox sends it again).
struct InFlight {
    stats: Arc<Stats>,
    answered: bool,
}

impl InFlight {
    fn new(stats: &Arc<Stats>) -> InFlight {
        bump(&stats.in_flight);
        InFlight { stats: stats.clone(), answered: false }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        drop_one(&self.stats.in_flight);
        if !self.answered {
            bump(&self.stats.failed);
        }
    }
}

/// Braid to the remote: the outbox's messages published on the remote, each acknowledged to
/// the outbox once the remote acknowledged it.
async fn out_pump(b: Arc<Bridge>, local: Client, remote: Remote) -> Ended {
    let mut pending = FuturesUnordered::new();
    loop {
        tokio::select! {
            event = local.recv_unacked() => match event {
                Some((Event::Message(p), received)) => {
                    let topic = p.topic.to_string();
                    match forward(&b, &remote, p).await {
                        Ok(Some(handle)) => {
                            let mut counted = InFlight::new(&b.stats);
                            pending.push(async move {
                                let result = handle.await;
                                counted.answered = result.is_ok() || matches!(result, Err(Error::Rejected(_)));
                                drop(counted);
                                (result, received, topic)
                            });
                        }
                        Ok(None) => {
                            if let Some(r) = received {
                                local.ack(r);
                            }
                        }
                        Err(why) => return Ended::Retry(why),
                    }
                }
                Some((Event::Disconnected(_), _)) | None => {
                    return Ended::Retry("the bridge's connection in Braid closed".into());
                }
                Some(_) => {}
            },
            Some((result, received, topic)) = pending.next(), if !pending.is_empty() => {
                match result {
                    Ok(_) => bump(&b.stats.sent),
                    Err(Error::Rejected(reason)) => {
                        b.dropped(&topic, &format!("the remote refused it: {} (0x{:02X})", reason.description(), reason as u8));
                    }
                    Err(e) => return Ended::Retry(format!("a message to the remote was not acknowledged: {e}")),
                }
                if let Some(r) = received {
                    local.ack(r);
                }
            }
        }
    }
}

/// Publishes `p` on the remote under the first `out` line that maps its topic: the handle
/// that resolves on the remote's acknowledgement, or None if the message cannot go out
/// (dropped and counted). A remote that announced a lower Maximum QoS, or no retained
/// messages, gets the message at its QoS, or without RETAIN.
async fn forward(b: &Bridge, remote: &Remote, p: Publish) -> Result<Option<PublishHandle>, String> {
    let routed = b
        .lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.outgoing())
        .find_map(|(i, l)| l.to_remote(&p.topic).map(|topic| (i, topic, l.qos)));
    let Some((i, topic, qos)) = routed else {
        b.dropped(&p.topic, "no out topic line maps it to a remote topic");
        return Ok(None);
    };
    let mut msg = Message {
        topic,
        payload: p.payload,
        qos: p.qos.min(qos),
        retain: p.retain,
        properties: carried(p.properties),
    };
    let client = remote.for_line(i);
    loop {
        match client.publish(msg.clone()).await {
            Ok(handle) => return Ok(Some(handle)),
            Err(Error::Rejected(ReasonCode::QoSNotSupported)) if msg.qos != QoS::AtMostOnce => {
                msg.qos = if msg.qos == QoS::ExactlyOnce { QoS::AtLeastOnce } else { QoS::AtMostOnce };
            }
            Err(Error::Rejected(ReasonCode::RetainNotSupported)) if msg.retain => msg.retain = false,
            Err(Error::Rejected(reason)) => {
                b.dropped(&p.topic, &format!("the remote cannot take it: {}", reason.description()));
                return Ok(None);
            }
            Err(e) => return Err(format!("cannot publish on the remote: {e}")),
        }
    }
}

/// The remote to Braid: `remote`'s messages (the connection's own client, or a QUIC data
/// stream's) published in Braid, each acknowledged to the remote once Braid acknowledged it.
/// The connection's own client also reports the remote's comings and goings.
async fn in_pump(b: Arc<Bridge>, remote: Client, local: Client, control: bool) -> Ended {
    let mut pending = FuturesUnordered::new();
    loop {
        tokio::select! {
            event = remote.recv_unacked() => match event {
                Some((Event::Message(p), received)) => {
                    let topic = p.topic.to_string();
                    match bring_in(&b, &local, p).await {
                        Ok(Some(handle)) => pending.push(async move { (handle.await, received, topic) }),
                        Ok(None) => {
                            if let Some(r) = received {
                                remote.ack(r);
                            }
                        }
                        Err(why) => return Ended::Retry(why),
                    }
                }
                Some((Event::Disconnected(reason), _)) => {
                    let why = match reason {
                        Some(r) => format!("the remote disconnected the bridge: {} (0x{:02X})", r.description(), r as u8),
                        None => "the connection to the remote was lost".into(),
                    };
                    if !control || remote::is_quic(&b) {
                        return Ended::Retry(why);
                    }
                    b.went_down(&why);
                }
                Some((Event::Connected(c), _)) => b.came_up(&c),
                None => return Ended::Retry("the connection to the remote ended".into()),
            },
            Some((result, received, topic)) = pending.next(), if !pending.is_empty() => {
                match result {
                    Ok(_) => bump(&b.stats.received),
                    Err(Error::Rejected(reason)) => {
                        b.skipped(&topic, &format!("Braid refused it: {} (0x{:02X})", reason.description(), reason as u8));
                    }
                    Err(e) => return Ended::Retry(format!("Braid did not acknowledge a message from the remote: {e}")),
                }
                if let Some(r) = received {
                    remote.ack(r);
                }
            }
        }
    }
}

/// Publishes the remote's message `p` in Braid under the first `in` line that maps its topic:
/// the handle that resolves on Braid's acknowledgement, or None if it was skipped (counted).
async fn bring_in(b: &Bridge, local: &Client, p: Publish) -> Result<Option<PublishHandle>, String> {
    let routed = b
        .lines
        .iter()
        .filter(|l| l.incoming())
        .find_map(|l| l.to_local(&p.topic).map(|topic| (topic, l.qos)));
    let Some((topic, qos)) = routed else {
        b.skipped(&p.topic, "no in topic line maps it to a Braid topic (a subscription an older configuration left on the remote?)");
        return Ok(None);
    };
    let msg = Message {
        topic,
        payload: p.payload,
        qos: p.qos.min(qos),
        retain: p.retain,
        properties: carried(p.properties),
    };
    match local.publish(msg).await {
        Ok(handle) => Ok(Some(handle)),
        Err(Error::Rejected(reason)) => {
            b.skipped(&p.topic, &format!("Braid cannot take it: {}", reason.description()));
            Ok(None)
        }
        Err(e) => Err(format!("cannot publish in Braid: {e}")),
    }
}

/// A delivery's properties as they go on: without what belongs to the delivery (Subscription
/// Identifiers, a Topic Alias).
fn carried(mut properties: Properties) -> Properties {
    if !properties.is_empty() {
        properties.subscription_identifiers.clear();
        properties.topic_alias = None;
    }
    properties
}

impl Bridge {
    /// The pauses between attempts: from the first, doubling up to `restart_timeout_secs`.
    fn backoff(&self) -> Backoff {
        Backoff::new(FIRST_BACKOFF, Duration::from_secs(self.config.restart_timeout_secs))
    }

    /// The remote accepted the connection (again).
    fn came_up(&self, connected: &Connected) {
        self.stats.set_up(true);
        self.down_said.store(false, Ordering::Relaxed);
        info!(bridge = %self.config.name, address = %self.config.address, client_id = %connected.client_id, session_present = connected.session_present, "mqtt bridge: connected to the remote");
        self.notify(true);
    }

    /// The remote is away, or the session failed: said (logged, notified) once per stretch.
    fn went_down(&self, why: &str) {
        self.stats.set_up(false);
        if !self.down_said.swap(true, Ordering::Relaxed) {
            warn!(bridge = %self.config.name, address = %self.config.address, "mqtt bridge: {why}; trying again (pauses up to {} s), messages for the remote wait in the outbox", self.config.restart_timeout_secs);
            self.notify(false);
        }
    }

    /// Publishes the connection's state, retained, on the notification topic.
    fn notify(&self, up: bool) {
        let Some(topic) = &self.notification_topic else { return };
        let payload = Bytes::from_static(if up { b"1" } else { b"0" });
        let msg = Internal::internal(ByteString::from(topic.clone()), payload, true);
        let _ = self.broker.publish(msg, std::time::Instant::now());
    }

    /// A message that cannot go out, for good: counted, logged (at most once a second).
    fn dropped(&self, topic: &str, why: &str) {
        bump(&self.stats.dropped);
        if self.stats.may_log() {
            warn!(bridge = %self.config.name, %topic, "mqtt bridge: message not bridged out: {why} (counted in $SYS/bridges/mqtt/{}/out/dropped)", self.config.name);
        }
    }

    /// A message from the remote that cannot come in: counted, logged (at most once a
    /// second).
    fn skipped(&self, topic: &str, why: &str) {
        bump(&self.stats.skipped);
        if self.stats.may_log() {
            warn!(bridge = %self.config.name, %topic, "mqtt bridge: message from the remote not published: {why} (counted in $SYS/bridges/mqtt/{}/in/skipped)", self.config.name);
        }
    }
}
