//! How two nodes authenticate a link: each proves it knows `cluster.secret` with an HMAC over
//! keys exported from the link's own TLS session, so a proof cannot be replayed on another
//! connection, and a node in the middle (two TLS sessions, two sets of keys) cannot pass one
//! side's proof on. The dialer speaks first: its name, incarnation and proof; the listener
//! answers with its own, or closes the connection.

use ring::hmac;

use crate::wire::{put, take, take_n, take_text, WireError};

/// The link protocol's version, first byte of a hello.
const VERSION: u8 = 1;
/// Label of the keys exported from the TLS session for the proofs.
pub(crate) const EXPORT_LABEL: &[u8] = b"EXPORTER-braid-cluster-link";
/// First byte of a listener's answer that refuses the link (a hello starts with [`VERSION`]).
const REFUSAL: u8 = 0;

/// Which side of a link a proof is from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Role {
    /// The node that dialed.
    Dialer,
    /// The node that listened.
    Listener,
}

/// A hello (or a listener's answer) that does not read, or a refusal.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HelloError {
    /// A field cut short or not UTF-8.
    #[error("{0}")]
    Wire(#[from] WireError),
    /// Another version of the link protocol.
    #[error("link protocol version {0}, this node speaks {VERSION}")]
    Version(u8),
    /// More bytes after the last field.
    #[error("trailing bytes after the hello")]
    TrailingBytes,
    /// The listener refused the link, saying why.
    #[error("refused: {0}")]
    Refused(String),
}

/// A node's first frame on a link.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    /// The node's name.
    pub node: String,
    /// Its incarnation, `name@start_ms`.
    pub incarnation: String,
    /// Its proof (see [`proof`]).
    pub proof: Vec<u8>,
}

impl Hello {
    /// The frame.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![VERSION];
        put(&mut out, self.node.as_bytes());
        put(&mut out, self.incarnation.as_bytes());
        put(&mut out, &self.proof);
        out
    }

    /// Reads a frame; an error says what is wrong with it.
    pub(crate) fn decode(mut frame: &[u8]) -> Result<Hello, HelloError> {
        let version = take_n::<1>(&mut frame)?[0];
        if version != VERSION {
            return Err(HelloError::Version(version));
        }
        let node = take_text(&mut frame)?;
        let incarnation = take_text(&mut frame)?;
        let proof = take(&mut frame)?.to_vec();
        if !frame.is_empty() {
            return Err(HelloError::TrailingBytes);
        }
        Ok(Hello { node, incarnation, proof })
    }
}

/// The listener's answer that refuses a link, saying why.
pub(crate) fn refusal(why: &str) -> Vec<u8> {
    let mut out = vec![REFUSAL];
    out.extend_from_slice(why.as_bytes());
    out
}

/// The listener's answer: its hello, or why it refused the link (`Err`).
pub(crate) fn answer(frame: &[u8]) -> Result<Hello, HelloError> {
    match frame.split_first() {
        Some((&REFUSAL, why)) => Err(HelloError::Refused(String::from_utf8_lossy(why).into_owned())),
        _ => Hello::decode(frame),
    }
}

/// `role`'s proof on a link between `dialer` and `listener` whose TLS session exported `keys`.
pub(crate) fn proof(secret: &str, role: Role, keys: &[u8; 32], dialer: &str, listener: &str) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    hmac::sign(&key, &signed(role, keys, dialer, listener)).as_ref().to_vec()
}

/// True if `tag` is `role`'s proof (compared in constant time).
pub(crate) fn verify(
    secret: &str,
    role: Role,
    keys: &[u8; 32],
    dialer: &str,
    listener: &str,
    tag: &[u8],
) -> bool {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    hmac::verify(&key, &signed(role, keys, dialer, listener), tag).is_ok()
}

fn signed(role: Role, keys: &[u8; 32], dialer: &str, listener: &str) -> Vec<u8> {
    let mut out = vec![match role {
        Role::Dialer => b'D',
        Role::Listener => b'L',
    }];
    out.extend_from_slice(keys);
    put(&mut out, dialer.as_bytes());
    put(&mut out, listener.as_bytes());
    out
}

/// What a node keeps in Redis to tell, at start, that its secret is not the other nodes': an
/// HMAC of a fixed text under the secret (not the secret).
pub(crate) fn fingerprint(secret: &str) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    let tag = hmac::sign(&key, b"braid cluster secret fingerprint");
    tag.as_ref().iter().take(16).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: [u8; 32] = [7; 32];

    #[test]
    fn a_hello_reads_back_and_a_cut_one_is_an_error() {
        let hello = Hello { node: "n1".into(), incarnation: "n1@5".into(), proof: vec![1, 2, 3] };
        let frame = hello.encode();
        assert_eq!(Hello::decode(&frame).unwrap(), hello);
        for cut in 0..frame.len() {
            assert!(Hello::decode(&frame[..cut]).is_err(), "cut at {cut}");
        }
        let mut other = frame.clone();
        other[0] = 9;
        let err = Hello::decode(&other).unwrap_err();
        assert!(matches!(err, HelloError::Version(9)), "{err:?}");
        assert!(err.to_string().contains("version 9"), "{err}");
    }

    #[test]
    fn a_refusal_reads_as_one() {
        assert_eq!(answer(&refusal("wrong secret")).unwrap_err().to_string(), "refused: wrong secret");
        let hello = Hello { node: "n1".into(), incarnation: "n1@5".into(), proof: vec![9; 32] };
        assert_eq!(answer(&hello.encode()).unwrap(), hello);
    }

    #[test]
    fn a_proof_holds_only_for_its_secret_role_session_and_names() {
        let p = proof("s3cret-s3cret-s3cret", Role::Dialer, &KEYS, "n1", "n2");
        assert!(verify("s3cret-s3cret-s3cret", Role::Dialer, &KEYS, "n1", "n2", &p));
        assert!(!verify("another-secret-here", Role::Dialer, &KEYS, "n1", "n2", &p));
        assert!(!verify("s3cret-s3cret-s3cret", Role::Listener, &KEYS, "n1", "n2", &p));
        assert!(!verify("s3cret-s3cret-s3cret", Role::Dialer, &[8; 32], "n1", "n2", &p));
        assert!(!verify("s3cret-s3cret-s3cret", Role::Dialer, &KEYS, "n1", "n3", &p));
    }

    #[test]
    fn the_fingerprint_differs_by_secret() {
        assert_eq!(fingerprint("a-secret-of-16-chars"), fingerprint("a-secret-of-16-chars"));
        assert_ne!(fingerprint("a-secret-of-16-chars"), fingerprint("b-secret-of-16-chars"));
    }
}
