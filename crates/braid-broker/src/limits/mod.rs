//! Overload protection. None of these drop a client's messages: a client over its rate, or any
//! publisher while memory is above the high-watermark, is simply not read from until it may go
//! on, so TCP flow control slows it down.
//!
//! - [`rate`]: token buckets (connection rate, per-client publish rate);
//! - [`memory`]: the memory alarm and the resident set size;
//! - [`topic`]: topic size limits.

pub mod memory;
pub mod rate;
pub mod topic;

pub use memory::{resident_memory, MemoryAlarm};
pub use rate::{PublishLimiter, TokenBucket};
pub use topic::topic_too_big;
