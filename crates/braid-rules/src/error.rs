//! Why a rule or a template was refused, and where.

use std::fmt;

use sqlparser::parser::ParserError;
use sqlparser::tokenizer::Span;

/// A place in a rule's SQL or in a template: line and column, both counted from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The line, from 1.
    pub line: u64,
    /// The column (in characters), from 1.
    pub column: u64,
}

/// A rule or template that cannot be compiled: what is wrong and, when known, where.
///
/// Displays as `line 1, column 17: unknown field `paylod.temp`; did you mean payload.temp?`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    position: Option<Position>,
    message: String,
}

impl RuleError {
    /// An error without a position.
    pub(crate) fn new(message: impl Into<String>) -> RuleError {
        RuleError { position: None, message: message.into() }
    }

    /// An error at the start of `span` (sqlparser's empty span, line 0, gives no position).
    pub(crate) fn at(span: Span, message: impl Into<String>) -> RuleError {
        let start = span.start;
        let position = (start.line > 0).then_some(Position { line: start.line, column: start.column });
        RuleError { position, message: message.into() }
    }

    /// An error at `position`.
    pub(crate) fn at_position(position: Position, message: impl Into<String>) -> RuleError {
        RuleError { position: Some(position), message: message.into() }
    }

    /// Where the problem is, when known.
    pub fn position(&self) -> Option<Position> {
        self.position
    }

    /// What the problem is, without the position.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some(Position { line, column }) => write!(f, "line {line}, column {column}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for RuleError {}

impl RuleError {
    /// sqlparser's error for `sql`, `Expected: X, found: Y at Line: 1, Column: 5`, as
    /// `line 1, column 5: expected X, found Y`. One at the end of `sql`, which sqlparser gives
    /// no position, is placed just after the last character.
    pub(crate) fn from_parser(err: ParserError, sql: &str) -> RuleError {
        let text = match err {
            ParserError::TokenizerError(s) | ParserError::ParserError(s) => s,
            ParserError::RecursionLimitExceeded => return RuleError::new("the rule is nested too deeply"),
        };
        let (message, position) = match text.rsplit_once(" at Line: ") {
            Some((message, at)) => (message, parse_position(at)),
            None => (text.as_str(), None),
        };
        let message = message.replace("Expected: ", "expected ").replace(", found: ", ", found ");
        match message.strip_suffix("found EOF") {
            Some(start) if position.is_none() => {
                let end = Position {
                    line: sql.lines().count().max(1) as u64,
                    column: sql.lines().last().unwrap_or_default().chars().count() as u64 + 1,
                };
                RuleError::at_position(end, format!("{start}found the end of the rule"))
            }
            _ => RuleError { position, message },
        }
    }
}

/// `1, Column: 5` as a position.
fn parse_position(at: &str) -> Option<Position> {
    let (line, column) = at.split_once(", Column: ")?;
    Some(Position { line: line.trim().parse().ok()?, column: column.trim().parse().ok()? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_errors_read_plainly() {
        let parser = |s: &str| ParserError::ParserError(s.to_owned());
        let err =
            RuleError::from_parser(parser("Expected: an expression, found: FROM at Line: 2, Column: 9"), "");
        assert_eq!(err.position(), Some(Position { line: 2, column: 9 }));
        assert_eq!(err.to_string(), "line 2, column 9: expected an expression, found FROM");
        let err = RuleError::from_parser(parser("Expected: an expression, found: EOF"), "SELECT\n  a +");
        assert_eq!(err.to_string(), "line 2, column 6: expected an expression, found the end of the rule");
        assert_eq!(RuleError::new("x").to_string(), "x");
    }
}
