//! The password file: one `username:hash` line per user, the hash an Argon2id PHC string
//! (`$argon2id$v=19$m=19456,t=2,p=1$salt$hash`), salted per user. `braid passwd` writes it;
//! the broker reads it at start and again when it changes. Verifying is deliberately slow (tens
//! of milliseconds), so the broker runs it off the async runtime.

use std::collections::BTreeMap;
use std::path::Path;

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

use super::file::{FileError, LineError};

/// Users and their password hashes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PasswordFile {
    users: BTreeMap<String, String>,
}

impl PasswordFile {
    /// Parses the file's text; the error names the line and the problem.
    pub fn parse(text: &str) -> Result<PasswordFile, LineError> {
        let mut users = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |problem: &str| Err(LineError { line: n + 1, problem: problem.into() });
            let Some((user, hash)) = line.split_once(':') else {
                return bad("expected username:hash");
            };
            if user.is_empty() {
                return bad("empty user name");
            }
            if PasswordHash::new(hash).is_err() {
                return bad("the hash is not a PHC string such as $argon2id$...");
            }
            if users.insert(user.to_string(), hash.to_string()).is_some() {
                return bad("user listed twice");
            }
        }
        Ok(PasswordFile { users })
    }

    /// Reads and parses the file at `path`.
    pub fn load(path: &Path) -> Result<PasswordFile, FileError> {
        super::file::load_file(path, PasswordFile::parse)
    }

    /// Writes the file (mode 0600) by replacing it atomically.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let lines = self.users.iter().map(|(user, hash)| format!("{user}:{hash}"));
        super::file::save_private(
            path,
            "braid password file: username:argon2id-hash (managed by `braid passwd`)",
            lines,
        )
    }

    /// True if `user` is listed.
    pub fn contains(&self, user: &str) -> bool {
        self.users.contains_key(user)
    }

    /// Number of users.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// True when no user is listed.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Sets `user`'s password (hashing it with a fresh salt). Slow.
    pub fn set(&mut self, user: &str, password: &[u8]) -> Result<(), String> {
        if user.is_empty() || user.contains([':', '\n', '\r']) {
            return Err(format!("{user:?}: a user name must be non-empty, without ':' or line breaks"));
        }
        self.users.insert(user.to_string(), hash(password)?);
        Ok(())
    }

    /// Removes `user`; false if it was not listed.
    pub fn remove(&mut self, user: &str) -> bool {
        self.users.remove(user).is_some()
    }

    /// Checks `password` for `user`: None if the user is not listed. Slow: call it off the
    /// async runtime.
    pub fn verify(&self, user: &str, password: &[u8]) -> Option<bool> {
        let hash = self.users.get(user)?;
        let ok =
            PasswordHash::new(hash).is_ok_and(|h| Argon2::default().verify_password(password, &h).is_ok());
        Some(ok)
    }
}

/// An Argon2id hash of `password` with a random salt, as a PHC string.
pub fn hash(password: &[u8]) -> Result<String, String> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default().hash_password(password, &salt).map(|h| h.to_string()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_verify_remove_round_trip() {
        let mut f = PasswordFile::default();
        f.set("alice", b"secret").unwrap();
        assert_eq!(f.verify("alice", b"secret"), Some(true));
        assert_eq!(f.verify("alice", b"wrong"), Some(false));
        assert_eq!(f.verify("bob", b"secret"), None);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("passwd");
        f.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("alice:$argon2id$"), "{text}");
        assert!(!text.contains("secret"));
        assert_eq!(PasswordFile::load(&path).unwrap(), f);
        assert!(f.remove("alice"));
        assert!(!f.remove("alice"));
    }

    #[test]
    fn salts_differ() {
        assert_ne!(hash(b"x").unwrap(), hash(b"x").unwrap());
    }

    #[test]
    fn bad_lines_are_named() {
        assert_eq!(PasswordFile::parse("# c\n\nalice").unwrap_err().line, 3);
        assert!(PasswordFile::parse("alice:plaintext").unwrap_err().problem.contains("PHC"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("passwd");
        assert!(matches!(PasswordFile::load(&path), Err(FileError::Read { path: p, .. }) if p == path));
        std::fs::write(&path, "alice").unwrap();
        let err = PasswordFile::load(&path).unwrap_err();
        assert!(matches!(&err, FileError::Line { source, .. } if source.line == 1), "{err:?}");
        assert_eq!(err.to_string(), format!("{}: line 1: expected username:hash", path.display()));
        assert!(PasswordFile::default().set("a:b", b"x").is_err());
    }
}
