//! Topic size limits (`limits.max_topic_length`, `limits.max_topic_levels`).

use crate::config::LimitsConfig;

/// Why a topic name or filter is refused, if it is.
pub fn topic_too_big(cfg: &LimitsConfig, topic: &str) -> Option<&'static str> {
    if topic.len() > cfg.max_topic_length {
        Some("topic longer than limits.max_topic_length")
    } else if topic.bytes().filter(|&b| b == b'/').count() >= cfg.max_topic_levels {
        Some("topic with more levels than limits.max_topic_levels")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_limits() {
        let cfg = LimitsConfig { max_topic_length: 10, max_topic_levels: 3, ..Default::default() };
        assert_eq!(topic_too_big(&cfg, "a/b/c"), None);
        assert!(topic_too_big(&cfg, "a/b/c/d").is_some());
        assert!(topic_too_big(&cfg, "abcdefghijk").is_some());
    }
}
