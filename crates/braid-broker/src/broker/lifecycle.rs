//! What happens when a client goes away: wills (with their delay) and session expiry, set as
//! timers; the timers themselves, driven from outside with the time; the connection sweep
//! (keep alive, parking).

use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_proto::{ByteString, LastWill, Publish};

use braid_rules::Event;

use super::rules::{disconnect_reason, Who};
use super::timers::Timer;
use super::{split_filter, Broker, Ending, SWEEP_INTERVAL};
use crate::control::Due;
use crate::message::Message;
use crate::session::{Release, Session};
use crate::store::Op;

impl Broker {
    /// A connection of `session` ended at `now`. Sends or schedules the will and ends or
    /// schedules the end of the session, unless another connection took the session over.
    /// What the client got through shared subscriptions and did not acknowledge goes to other
    /// members of those groups (see [`crate::session::SessionState::take_shared`]).
    pub fn disconnected(&self, session: &Arc<Session>, generation: u64, ending: Ending, now: Instant) {
        let others = self.other_members(session);
        let (will_delay, expiry, ctl, transport, taken, who) = {
            let mut st = session.lock();
            let ctl = st.link.as_ref().map(|l| l.ctl.clone());
            let transport = st.link.as_ref().and_then(|l| l.origin.transport);
            if !st.is_attached(generation) {
                return;
            }
            let who = if self.rules_take(Event::ClientDisconnected) { Who::of(&st) } else { None };
            let taken = st.take_shared(&others);
            st.detach(generation);
            if ending != Ending::WithWill {
                st.will = None;
            }
            // Saved with a delayed will, so a restart before the delay still sends it.
            st.save(self.unix_secs(now));
            (
                st.will.as_ref().map(|w| will_delay(w, st.expiry_secs)),
                st.expiry_secs,
                ctl,
                transport,
                taken,
                who,
            )
        };
        if let Some(who) = who {
            let reason =
                disconnect_reason(ending, ctl.as_ref().filter(|c| c.is_closed()).map(|c| c.reason()));
            self.raise_disconnected(&session.client_id, &who, reason, now);
        }
        self.hand_to_other_members(session, &others, taken, now);
        session.release_publishers(Release::All);
        self.metrics.client_disconnected(transport);
        self.schedule_end(session, generation, will_delay, expiry, now, 0);
        // A CONNECT waiting to take the session over goes on, and finds it ended or offline.
        if let Some(ctl) = ctl {
            ctl.hand_over();
        }
        self.handovers.notify_waiters();
    }

    /// At `now`, for `session`, offline for `offline_for` seconds already: sends its will
    /// `will_delay` seconds after it went offline (if it has one; here if that is already past)
    /// and ends it `expiry` seconds after (here if 0), through timers that do nothing if
    /// connection `generation` is no longer the session's latest by then.
    pub(super) fn schedule_end(
        &self,
        session: &Arc<Session>,
        generation: u64,
        will_delay: Option<u32>,
        expiry: u32,
        now: Instant,
        offline_for: u32,
    ) {
        let after = |secs: u32| now + Duration::from_secs(u64::from(secs.saturating_sub(offline_for)));
        match will_delay {
            Some(delay) if delay <= offline_for => self.send_delayed_will(session, generation, now),
            Some(delay) => self.set_timer(after(delay), Timer::Will { session: session.clone(), generation }),
            None => {}
        }
        match expiry {
            0 => self.end_session(session),
            u32::MAX => {}
            expiry => self.set_timer(after(expiry), Timer::Expiry { session: session.clone(), generation }),
        }
    }

    /// Sets `timer` for `at`, telling the runtime if it is now the earliest.
    pub(super) fn set_timer(&self, at: Instant, timer: Timer) {
        if self.timers.lock().set(at, timer) {
            self.timers_changed.notify_one();
        }
    }

    /// When [`Broker::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.lock().next()
    }

    /// Runs every timer due at `now`: delayed wills, session expiries, the connection sweep.
    pub fn handle_timeout(&self, now: Instant) {
        loop {
            // Popped one at a time: what a timer does may set timers.
            let Some(timer) = self.timers.lock().pop_due(now) else { return };
            match timer {
                Timer::Will { session, generation } => self.send_delayed_will(&session, generation, now),
                Timer::Expiry { session, generation } => {
                    let still_offline = {
                        let st = session.lock();
                        st.generation == generation && !st.is_online()
                    };
                    if still_offline {
                        self.end_session(&session);
                    }
                }
                Timer::Sweep => {
                    self.sweep_connections(now);
                    self.set_timer(now + SWEEP_INTERVAL, Timer::Sweep);
                }
            }
        }
    }

    /// Publishes the will of offline `session`, still pending since connection `generation`.
    fn send_delayed_will(&self, session: &Session, generation: u64, now: Instant) {
        let will = {
            let mut st = session.lock();
            if st.generation != generation {
                return;
            }
            let will = st.will.take();
            st.save(self.unix_secs(now));
            will
        };
        if let Some(will) = will {
            self.publish_will(session, *will, now);
        }
    }

    /// Removes the session from the registry (if it is still the registered one) and its
    /// subscriptions from the router.
    fn end_session(&self, session: &Arc<Session>) {
        let registered = {
            let mut sessions = self.sessions.lock();
            let registered = sessions.get(&*session.client_id).is_some_and(|s| Arc::ptr_eq(&s.0, session));
            if registered {
                sessions.remove(&*session.client_id);
            }
            registered
        };
        self.drop_subscriptions(session);
        session.lock().forget();
        if let (true, Some(directory)) = (registered, self.directory()) {
            directory.ended(&session.client_id);
        }
    }

    pub(super) fn drop_subscriptions(&self, session: &Session) {
        let filters: Vec<ByteString> = session.lock().subscriptions.drain().map(|(f, _)| f).collect();
        let mut router = self.router.write();
        for filter in &filters {
            if let Some((inner, group)) = split_filter(filter) {
                router.unsubscribe(inner, group, session.id);
            }
        }
    }

    /// Publishes `will` of `session` at `now`.
    pub(super) fn publish_will(&self, session: &Session, will: LastWill, now: Instant) {
        let mut properties = will.properties;
        if properties.will_delay_interval.is_some() {
            properties.will_delay_interval = None;
        }
        let p = Publish {
            dup: false,
            qos: will.qos,
            retain: will.retain,
            topic: will.topic,
            packet_id: 0,
            properties,
            payload: will.payload,
        };
        let msg = Message::from_publish(p, now, session.id, session.client_id.clone());
        let _ = self.publish(msg, now);
    }

    /// Closes every connection that has been silent at `now` for 1.5 times its keep alive, and
    /// asks those idle for `listeners.park_after_secs` to park. One sweep every
    /// [`SWEEP_INTERVAL`] replaces a timer per connection: a scan of the liveness table (see
    /// [`crate::control::LivenessTable`]), which reaches only the connections it acts on and
    /// takes no session's lock.
    fn sweep_connections(&self, now: Instant) {
        let now = self.clock_ms(now);
        let park_after = self.config.listeners.park_after_secs.saturating_mul(1000);
        self.liveness.sweep(now, park_after, |ctl, due| match due {
            Due::KeepAlive => ctl.expire_if_silent(now),
            Due::Idle => ctl.request_park_if_idle(now, park_after),
        });
    }

    /// Removes retained messages expired at `now` (from the store too).
    pub fn purge_expired_retained(&self, now: Instant) {
        let purged = self.retained.write().purge_expired(now);
        if self.store.persistent() {
            for msg in purged {
                self.store.submit(Op::Retain(Message::internal(msg.topic.clone(), Default::default(), true)));
            }
        }
    }
}

/// Seconds a will waits after its connection ended: its Will Delay Interval, at most the
/// session's expiry.
pub(super) fn will_delay(will: &LastWill, expiry: u32) -> u32 {
    will.properties.will_delay_interval.unwrap_or(0).min(expiry)
}
