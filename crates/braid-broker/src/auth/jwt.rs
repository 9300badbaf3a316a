//! JSON Web Tokens in the CONNECT password field: signature checked with the configured key
//! (HS256 secret, RS256 or ES256 PEM public key), `exp` required and in the future, `sub` (if
//! present) the user name, and an optional claim carrying the client's ACL:
//! `{"publish": ["filter", ...], "subscribe": ["filter", ...]}`.

use std::path::Path;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

/// Checks tokens against one key.
pub struct JwtVerifier {
    key: DecodingKey,
    validation: Validation,
    acl_claim: String,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier").field("algorithms", &self.validation.algorithms).finish()
    }
}

/// The ACL a token grants: allowed filters, everything else denied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclClaim {
    /// Filters the client may publish to.
    #[serde(default)]
    pub publish: Vec<String>,
    /// Filters the client may subscribe to.
    #[serde(default)]
    pub subscribe: Vec<String>,
}

/// What a valid token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// The `sub` claim.
    pub subject: Option<String>,
    /// The ACL claim, if the token has one.
    pub acl: Option<AclClaim>,
}

impl JwtVerifier {
    /// A verifier for `algorithm` (`HS256`, `RS256`, `ES256`) with the key in `key_file`.
    pub fn load(algorithm: &str, key_file: &Path, acl_claim: &str) -> Result<JwtVerifier, String> {
        let bytes =
            std::fs::read(key_file).map_err(|e| format!("cannot read {}: {e}", key_file.display()))?;
        let bad_key =
            |e: jsonwebtoken::errors::Error| format!("{}: not a {algorithm} key: {e}", key_file.display());
        let (alg, key) = match algorithm {
            "HS256" => {
                let secret = String::from_utf8_lossy(&bytes).trim_end().as_bytes().to_vec();
                if secret.is_empty() {
                    return Err(format!("{}: the HS256 secret is empty", key_file.display()));
                }
                (Algorithm::HS256, DecodingKey::from_secret(&secret))
            }
            "RS256" => (Algorithm::RS256, DecodingKey::from_rsa_pem(&bytes).map_err(bad_key)?),
            "ES256" => (Algorithm::ES256, DecodingKey::from_ec_pem(&bytes).map_err(bad_key)?),
            other => return Err(format!("{other:?}: expected HS256, RS256 or ES256")),
        };
        let mut validation = Validation::new(alg);
        validation.leeway = 0;
        validation.validate_aud = false;
        Ok(JwtVerifier { key, validation, acl_claim: acl_claim.to_string() })
    }

    /// True if `password` has the shape of a JWT (three base64url parts), so that ordinary
    /// passwords are not reported as bad tokens.
    pub fn looks_like_token(password: &[u8]) -> bool {
        let parts = password.split(|&b| b == b'.').count();
        parts == 3
            && password.len() > 10
            && password.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'='))
    }

    /// Checks `token`; the error says what is wrong with it.
    pub fn verify(&self, token: &[u8]) -> Result<Claims, String> {
        let token = std::str::from_utf8(token).map_err(|_| "token is not ASCII".to_string())?;
        let data = jsonwebtoken::decode::<serde_json::Value>(token, &self.key, &self.validation)
            .map_err(|e| e.to_string())?;
        let claims = data.claims;
        let subject = match claims.get("sub") {
            None => None,
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(_) => return Err("claim sub is not a string".into()),
        };
        let acl = match claims.get(&self.acl_claim) {
            None => None,
            Some(v) => Some(AclClaim::deserialize(v).map_err(|e| format!("claim {}: {e}", self.acl_claim))?),
        };
        Ok(Claims { subject, acl })
    }
}
