//! API keys: the file `admin.api_keys_file`, one `name:sha256:HEX` line per key, written by
//! `braid apikey`. A key is `braid_` and 43 characters of base64url: 256 random bits, shown once
//! when it is made; the file keeps only its SHA-256. A fast hash is as safe as a slow one
//! here: the slow hashes of the password file protect secrets people choose and can guess,
//! these cannot be guessed; and a fast check lets the dashboard poll without a cost per request.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine;
use braid_broker::auth::{load_file, save_private, FileError, LineError};

/// The prefix of every key (so that secret scanners can spot one).
const PREFIX: &str = "braid_";

/// Keys by name, as their SHA-256 in hex.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiKeys {
    keys: BTreeMap<String, String>,
}

impl ApiKeys {
    /// Parses the file's text; the error names the line and the problem.
    pub fn parse(text: &str) -> Result<ApiKeys, LineError> {
        let mut keys = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |problem: &str| Err(LineError { line: n + 1, problem: problem.into() });
            let Some((name, hash)) = line.split_once(':') else { return bad("expected name:sha256:HEX") };
            let Some(hex) = hash.strip_prefix("sha256:") else { return bad("expected name:sha256:HEX") };
            if !valid_name(name) {
                return bad("a key's name is letters, digits, '-', '_' or '.'");
            }
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return bad("the hash is not 64 hex digits");
            }
            if keys.insert(name.to_string(), hex.to_ascii_lowercase()).is_some() {
                return bad("name listed twice");
            }
        }
        Ok(ApiKeys { keys })
    }

    /// Reads and parses the file at `path`; a missing file is an error.
    pub fn load(path: &Path) -> Result<ApiKeys, FileError> {
        load_file(path, ApiKeys::parse)
    }

    /// Reads the file at `path`, or nothing if there is none yet.
    pub fn load_or_empty(path: &Path) -> Result<ApiKeys, FileError> {
        match path.exists() {
            true => ApiKeys::load(path),
            false => Ok(ApiKeys::default()),
        }
    }

    /// Writes the file (mode 0600) by replacing it atomically.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let lines = self.keys.iter().map(|(name, hex)| format!("{name}:sha256:{hex}"));
        save_private(path, "braid API keys: name:sha256:HEX (managed by `braid apikey`)", lines)
    }

    /// Makes a key named `name` (replacing one of that name) and returns it: the only time
    /// it is seen.
    pub fn add(&mut self, name: &str) -> Result<String, String> {
        if !valid_name(name) {
            return Err(format!("{name:?}: a key's name is letters, digits, '-', '_' or '.'"));
        }
        let secret: [u8; 32] = rand::random();
        let key = format!("{PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret));
        self.keys.insert(name.to_string(), sha256_hex(&key));
        Ok(key)
    }

    /// Removes `name`'s key; false if there is none.
    pub fn remove(&mut self, name: &str) -> bool {
        self.keys.remove(name).is_some()
    }

    /// The names of the keys.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// The name of the key `key`, if it is one of these (and, when `name` is given, that one's).
    pub fn check(&self, key: &str, name: Option<&str>) -> Option<&str> {
        let hex = sha256_hex(key);
        self.keys
            .iter()
            .find(|(n, h)| **h == hex && name.is_none_or(|want| want == n.as_str()))
            .map(|(n, _)| n.as_str())
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

fn sha256_hex(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_shown_once_kept_hashed_and_checked_by_name() {
        let mut keys = ApiKeys::default();
        let k = keys.add("ops").unwrap();
        assert!(k.starts_with("braid_") && k.len() == 6 + 43, "{k}");
        assert_eq!(keys.check(&k, None), Some("ops"));
        assert_eq!(keys.check(&k, Some("ops")), Some("ops"));
        assert_eq!(keys.check(&k, Some("other")), None);
        assert_eq!(keys.check("braid_wrong", None), None);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        keys.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&k[6..]), "the file keeps no key: {text}");
        assert_eq!(ApiKeys::load(&path).unwrap(), keys);
        assert!(keys.remove("ops"));
        assert_eq!(keys.check(&k, None), None);
    }

    #[test]
    fn a_bad_line_is_named() {
        let e = ApiKeys::parse("# c\nops:sha256:abc\n").unwrap_err();
        assert_eq!(e.to_string(), "line 2: the hash is not 64 hex digits");
        assert!(ApiKeys::add(&mut ApiKeys::default(), "bad name").is_err());
    }
}
