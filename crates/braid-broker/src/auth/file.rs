//! Loading the password and ACL rules files (and the admin listener's API keys), what goes
//! wrong doing it, and writing such a file.

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
pub fn load_file<T>(path: &Path, parse: impl FnOnce(&str) -> Result<T, LineError>) -> Result<T, FileError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| FileError::Read { path: path.into(), source })?;
    parse(&text).map_err(|source| FileError::Line { path: path.into(), source })
}

/// Writes `header` (a `#` comment line) and `lines` to `path`, mode 0600, by replacing the file
/// atomically (a new file in the same directory, synced, then renamed over it).
pub fn save_private(
    path: &Path,
    header: &str,
    lines: impl IntoIterator<Item = String>,
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".braid-{:016x}.tmp", rand::random::<u64>()));
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    writeln!(file, "# {header}")?;
    for line in lines {
        writeln!(file, "{line}")?;
    }
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}
