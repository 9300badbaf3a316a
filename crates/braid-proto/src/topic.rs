//! Topic names, topic filters, matching, and shared subscription filters.
//!
//! A topic name is what a PUBLISH is sent to (`sport/tennis/player1`); a topic filter is what a
//! SUBSCRIBE asks for and may use the wildcards `+` (exactly one level) and `#` (any number of
//! levels, including none, at the end). Levels are separated by `/` and may be empty.

/// Longest topic name or filter: a UTF-8 string field holds at most 65,535 bytes.
const MAX_LEN: usize = u16::MAX as usize;

/// True if `topic` may be used as a topic name: non-empty, at most 65,535 bytes, and without the
/// wildcards `+` and `#` or the character U+0000.
///
/// An empty topic name can still appear in a v5 PUBLISH that uses a Topic Alias; that case is
/// handled by the codec, not here.
pub fn valid_topic_name(topic: &str) -> bool {
    !topic.is_empty() && topic.len() <= MAX_LEN && !topic.bytes().any(|b| matches!(b, b'+' | b'#' | 0))
}

/// True if `filter` may be used as a topic filter: non-empty, at most 65,535 bytes, without
/// U+0000, `#` only as the whole last level (`sport/#`, `#`) and `+` only as a whole level
/// (`+/tennis/+`). `sport+`, `sport/#/ranking` and `sport#` are invalid.
pub fn valid_topic_filter(filter: &str) -> bool {
    if filter.is_empty() || filter.len() > MAX_LEN || filter.contains('\0') {
        return false;
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        let is_last = levels.peek().is_none();
        let ok = match level {
            "+" => true,
            "#" => is_last,
            _ => !level.contains(['+', '#']),
        };
        if !ok {
            return false;
        }
    }
    true
}

/// True if the topic name `topic` matches the topic filter `filter`.
///
/// `+` matches exactly one level (possibly empty), `#` matches the rest of the topic including
/// its parent level, so `sport/#` matches `sport` as well as `sport/tennis`. A topic starting
/// with `$` (such as `$SYS/...`) is not matched by a filter starting with a wildcard; it needs a
/// filter that starts with the same `$` level. `filter` is assumed valid (see
/// [`valid_topic_filter`]); shared subscription prefixes must be removed first with
/// [`parse_shared`].
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && filter.starts_with(['+', '#']) {
        return false;
    }
    let mut filter_levels = filter.split('/');
    let mut topic_levels = topic.split('/');
    loop {
        match (filter_levels.next(), topic_levels.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(f), Some(t)) if f == t => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// True when the filters' first levels rule out a common topic because of `$` (a wildcard at
/// the start of a filter never matches a `$` topic).
fn dollar_mismatch(a: &str, b: &str) -> bool {
    let wild = |f: &str| f.starts_with(['+', '#']);
    (wild(a) && b.starts_with('$')) || (wild(b) && a.starts_with('$'))
}

/// True if the filter `outer` matches every topic the filter `inner` matches. Both are assumed
/// valid, without shared subscription prefixes.
pub fn covers(outer: &str, inner: &str) -> bool {
    if dollar_mismatch(outer, inner) {
        return false;
    }
    let (mut o, mut i) = (outer.split('/'), inner.split('/'));
    loop {
        match (o.next(), i.next()) {
            (Some("#"), _) => return true,
            (None, None) => return true,
            (Some("+"), Some(l)) if l != "#" => {}
            (Some(a), Some(b)) if a == b && a != "+" && a != "#" => {}
            _ => return false,
        }
    }
}

/// True if some topic matches both filters `a` and `b`. Both are assumed valid, without shared
/// subscription prefixes.
pub fn intersects(a: &str, b: &str) -> bool {
    if dollar_mismatch(a, b) {
        return false;
    }
    let (mut x, mut y) = (a.split('/'), b.split('/'));
    loop {
        match (x.next(), y.next()) {
            (Some("#"), _) | (_, Some("#")) => return true,
            (None, None) => return true,
            (Some("+"), Some(_)) | (Some(_), Some("+")) => {}
            (Some(l), Some(r)) if l == r => {}
            _ => return false,
        }
    }
}

/// A shared subscription filter split into its share name and the topic filter it applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SharedFilter<'a> {
    /// The share name (`$share/{group}/...`), or `"$queue"` for the legacy `$queue/...` form.
    pub group: &'a str,
    /// The topic filter that messages are matched against.
    pub filter: &'a str,
}

/// Why a `$share/...` or `$queue/...` filter is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum SharedFilterError {
    /// `$share` without a share name, or with an empty one (`$share//a`).
    #[error("shared subscription without a share name")]
    EmptyGroup,
    /// The share name contains `+` or `#`.
    #[error("share name contains a wildcard")]
    InvalidGroup,
    /// The filter after the share name is missing or not a valid topic filter.
    #[error("invalid topic filter in shared subscription")]
    InvalidFilter,
}

const SHARE: &str = "$share";
const QUEUE: &str = "$queue";

/// Splits off the first level: `a/b/c` is `("a", Some("b/c"))`, `a` is `("a", None)`.
fn split_level(s: &str) -> (&str, Option<&str>) {
    match s.split_once('/') {
        Some((first, rest)) => (first, Some(rest)),
        None => (s, None),
    }
}

/// Splits a shared subscription filter.
///
/// `$share/{group}/{filter}` needs a non-empty group without `+`, `#` or `/`, followed by a
/// valid topic filter; the legacy `$queue/{filter}` has the group `"$queue"`. Returns
/// `Ok(None)` for a filter whose first level is neither `$share` nor `$queue` (an ordinary
/// filter, which this does not validate), and an error for a malformed shared one.
pub fn parse_shared(filter: &str) -> Result<Option<SharedFilter<'_>>, SharedFilterError> {
    let (group, filter) = match split_level(filter) {
        (SHARE, rest) => {
            let (group, filter) = split_level(rest.unwrap_or(""));
            if group.is_empty() {
                return Err(SharedFilterError::EmptyGroup);
            }
            if group.contains(['+', '#']) {
                return Err(SharedFilterError::InvalidGroup);
            }
            (group, filter)
        }
        (QUEUE, filter) => (QUEUE, filter),
        _ => return Ok(None),
    };
    let filter = filter.ok_or(SharedFilterError::InvalidFilter)?;
    if !valid_topic_filter(filter) {
        return Err(SharedFilterError::InvalidFilter);
    }
    Ok(Some(SharedFilter { group, filter }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names() {
        for name in ["a", "/", "sport/tennis/player1", "sport/", "/finance", "$SYS/x", "a b", "é/ü"] {
            assert!(valid_topic_name(name), "{name}");
        }
        for name in ["", "+", "#", "a/+", "a/#", "a+", "a\0b"] {
            assert!(!valid_topic_name(name), "{name:?}");
        }
        assert!(valid_topic_name(&"a".repeat(65_535)));
        assert!(!valid_topic_name(&"a".repeat(65_536)));
    }

    #[test]
    fn topic_filters() {
        for filter in [
            "a",
            "#",
            "+",
            "/",
            "+/+",
            "/+",
            "+/",
            "sport/#",
            "sport/tennis/#",
            "sport/+/player1",
            "+/tennis/#",
            "$SYS/#",
            "//",
        ] {
            assert!(valid_topic_filter(filter), "{filter}");
        }
        for filter in
            ["", "sport+", "sport/tennis#", "sport/#/ranking", "#/", "##", "++", "a/b+/c", "+a", "a\0"]
        {
            assert!(!valid_topic_filter(filter), "{filter:?}");
        }
        assert!(valid_topic_filter(&"a".repeat(65_535)));
        assert!(!valid_topic_filter(&"a".repeat(65_536)));
    }

    #[test]
    fn matching_spec_examples() {
        let yes = [
            ("sport/tennis/player1/#", "sport/tennis/player1"),
            ("sport/tennis/player1/#", "sport/tennis/player1/ranking"),
            ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon"),
            ("sport/#", "sport"),
            ("sport/#", "sport/"),
            ("#", "sport/tennis"),
            ("#", "/"),
            ("sport/tennis/+", "sport/tennis/player1"),
            ("sport/+", "sport/"),
            ("+/+", "/finance"),
            ("/+", "/finance"),
            ("+", "sport"),
            ("+/tennis/#", "sport/tennis"),
            ("a/b", "a/b"),
            ("$SYS/#", "$SYS/broker/load"),
            ("$SYS/+/load", "$SYS/broker/load"),
            ("$SYS", "$SYS"),
        ];
        for (filter, topic) in yes {
            assert!(matches(filter, topic), "{filter} should match {topic}");
        }
        let no = [
            ("sport/tennis/+", "sport/tennis/player1/ranking"),
            ("sport/tennis/+", "sport/tennis"),
            ("sport/+", "sport"),
            ("+", "/finance"),
            ("+", "a/b"),
            ("a/b", "a/b/c"),
            ("a/b/c", "a/b"),
            ("a/b", "a/c"),
            ("a", "A"),
            ("a/b", "a/b/"),
        ];
        for (filter, topic) in no {
            assert!(!matches(filter, topic), "{filter} should not match {topic}");
        }
    }

    #[test]
    fn wildcards_do_not_match_dollar_topics() {
        assert!(!matches("#", "$SYS/broker"));
        assert!(!matches("#", "$SYS"));
        assert!(!matches("+/monitor/Clients", "$SYS/monitor/Clients"));
        assert!(!matches("+", "$SYS"));
        assert!(matches("$SYS/monitor/+", "$SYS/monitor/Clients"));
        // Only the first level matters: `$` further down is an ordinary character.
        assert!(matches("a/#", "a/$b"));
        assert!(matches("a/+", "a/$b"));
    }

    #[test]
    fn shared_filters() {
        assert_eq!(
            parse_shared("$share/g1/sport/#"),
            Ok(Some(SharedFilter { group: "g1", filter: "sport/#" }))
        );
        assert_eq!(parse_shared("$share/g/+"), Ok(Some(SharedFilter { group: "g", filter: "+" })));
        assert_eq!(parse_shared("$queue/a/b"), Ok(Some(SharedFilter { group: "$queue", filter: "a/b" })));
        assert_eq!(parse_shared("$queue/#"), Ok(Some(SharedFilter { group: "$queue", filter: "#" })));
        for ordinary in ["sport/#", "$SYS/#", "#", "$sharefoo/a", "$share_/a/b", "a/$share/g/b", "$queuex/a"]
        {
            assert_eq!(parse_shared(ordinary), Ok(None), "{ordinary}");
        }
    }

    #[test]
    fn malformed_shared_filters() {
        let cases = [
            ("$share", SharedFilterError::EmptyGroup),
            ("$share/", SharedFilterError::EmptyGroup),
            ("$share//a", SharedFilterError::EmptyGroup),
            ("$share/g", SharedFilterError::InvalidFilter),
            ("$share/g/", SharedFilterError::InvalidFilter),
            ("$share/g+/a", SharedFilterError::InvalidGroup),
            ("$share/#/a", SharedFilterError::InvalidGroup),
            ("$share/+/a", SharedFilterError::InvalidGroup),
            ("$share/g/a/#/b", SharedFilterError::InvalidFilter),
            ("$share/g/a+", SharedFilterError::InvalidFilter),
            ("$queue", SharedFilterError::InvalidFilter),
            ("$queue/", SharedFilterError::InvalidFilter),
            ("$queue/a#", SharedFilterError::InvalidFilter),
        ];
        for (filter, error) in cases {
            assert_eq!(parse_shared(filter), Err(error), "{filter}");
        }
    }

    #[test]
    fn filter_relations() {
        assert!(covers("a/#", "a"));
        assert!(covers("a/+", "a/b"));
        assert!(!covers("a/+", "a/#"));
        assert!(!covers("a/b", "a/+"));
        assert!(intersects("a/+", "+/b"));
        assert!(intersects("a/#", "a"));
        assert!(!intersects("a/b", "a/c"));
        assert!(!intersects("a/b/c", "a/b"));
    }
}
