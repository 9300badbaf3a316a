//! The settings that change without a restart: `[limits]` and `[session]` (queue limits and
//! policies, expiry caps, the slow-consumer timeout). [`crate::Broker::apply_live`] puts a
//! reloaded configuration's in force; a connection takes them when it connects, so a change
//! reaches clients as they (re)connect and no one is dropped for it.

use std::sync::Arc;

use crate::config::{Config, LimitsConfig, QueuePolicy, SessionConfig};
use crate::session::QueueLimits;
use crate::transport_kind::{PerTransport, Transport};

/// `[limits]` and `[session]` as they are now.
#[derive(Debug)]
pub struct Live {
    /// `[limits]`.
    pub limits: LimitsConfig,
    /// `[session]`.
    pub session: SessionConfig,
    /// `[session]`'s queue limits: those of sessions read back from the store.
    pub(crate) queue_limits: Arc<QueueLimits>,
    /// Each listener's clients' queue limits (`[session]` with `[session.listeners.<transport>]`).
    listener_limits: PerTransport<Arc<QueueLimits>>,
}

impl Live {
    /// The settings of `config`.
    pub(crate) fn of(config: &Config) -> Live {
        let queue_limits = Arc::new(QueueLimits::from_config(&config.session));
        let listener_limits = config.session.listeners.map(|_, policy| {
            if policy == &QueuePolicy::default() {
                queue_limits.clone()
            } else {
                Arc::new(QueueLimits::with_policy(&config.session, policy))
            }
        });
        Live { limits: config.limits.clone(), session: config.session.clone(), queue_limits, listener_limits }
    }

    /// The queue limits of clients of `transport`.
    pub fn listener_limits(&self, transport: Transport) -> Arc<QueueLimits> {
        self.listener_limits.get(transport).clone()
    }
}
