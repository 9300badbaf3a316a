//! The Lua scripts the cluster runs in Redis (sent with EVAL), one file each in `src/lua/`.
//! Every key a script touches is one of its KEYS, and the KEYS of one script share a hash
//! tag (see [`crate::keys`]), so each runs on one slot of a Redis Cluster.

/// Applies one change to a session's keys (KEYS: meta, queue, stages, qos2) if ARGV[1], the
/// writer's epoch, is still the session's (0: unfenced); ARGV[2] names the change, ARGV[3..]
/// are its arguments. Returns 0 if fenced, else 1 (see [`crate::store`]).
pub(crate) const SESSION_OP: &str = include_str!("lua/session_op.lua");

/// Sets (ARGV[2] not empty) or clears retained topic ARGV[1] in KEYS[1] and logs the change
/// in KEYS[2] for the other nodes.
pub(crate) const RETAIN_OP: &str = include_str!("lua/retain_op.lua");

/// Takes ownership for ARGV[1], raising the epoch (unless ARGV[1] holds it already: its own
/// writes under way stay valid); with ARGV[2] = 1 (clean start) the old session's data goes
/// and the epoch is raised in any case (what was under way for the old one is refused).
/// KEYS: a session's four. Returns {epoch, previous owner}.
pub(crate) const CLAIM: &str = include_str!("lua/claim.lua");

/// A session of ARGV[1] ended: its ownership record KEYS[1] (epoch and owner) expires in a day
/// unless the client id is claimed again (the claim keeps it). It is not removed at once: a
/// claim of the same client id may be under way, and the epoch fences nodes that missed the
/// end.
pub(crate) const ENDED: &str = include_str!("lua/ended.lua");

/// Renews lease KEYS[1] for ARGV[2] ms if incarnation ARGV[1] holds it or nobody does: 1 if
/// renewed, 2 if it had lapsed (or Redis lost it), 0 if another process holds it.
pub(crate) const RENEW: &str = include_str!("lua/renew.lua");

/// Claims session meta KEYS[1] for ARGV[2] if ARGV[1] still owns it: returns the new epoch,
/// or 0.
pub(crate) const CLAIM_FROM: &str = include_str!("lua/claim_from.lua");

/// Deletes rebalance KEYS[1] if it is still ARGV[1] (the one under way): 1 if deleted.
pub(crate) const END_REBALANCE: &str = include_str!("lua/end_rebalance.lua");
