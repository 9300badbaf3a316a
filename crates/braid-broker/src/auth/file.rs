//! Loading the password and ACL rules files, and what goes wrong doing it.

use std::path::{Path, PathBuf};

/// A line of a password or ACL rules file that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {problem}")]
pub struct LineError {
    /// The line number, from 1.
    pub line: usize,
    /// What is wrong with it.
    pub problem: String,
}

/// A password or ACL rules file that cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line of the file does not parse.
    #[error("{}: {source}", path.display())]
    Line {
        /// The file.
        path: PathBuf,
        /// The line and the problem.
        #[source]
        source: LineError,
    },
}

/// Reads the file at `path` and parses its text with `parse`.
pub(super) fn load_file<T>(
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T, LineError>,
) -> Result<T, FileError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| FileError::Read { path: path.into(), source })?;
    parse(&text).map_err(|source| FileError::Line { path: path.into(), source })
}
