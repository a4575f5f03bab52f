//! API keys and scopes: what a bearer token may do.
//!
//! A key is held only as the SHA-256 digest of its secret. Checking a token hashes it once and
//! compares the digest with **every** configured key in constant time (no early exit), so
//! neither the comparison nor the loop leaks which bytes or which key nearly matched; comparing
//! fixed-length digests also hides the secret's length. Scopes: `ingest` (send fixes), `read`
//! (fences, devices, events, metrics when not open), `admin` (change fences and webhooks; implies
//! the other two). With no keys configured, authentication is off and every request is allowed:
//! the service says so loudly at start.
//!
//! Pure: no I/O, no clock; the HTTP layer (`http::auth`) extracts tokens and maps routes to
//! scopes.

use std::fmt;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use thiserror::Error;

/// What a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Send fixes (HTTP, WebSocket ingest, tracker protocols).
    Ingest,
    /// Read fences, devices, events and metrics.
    Read,
    /// Change fences and webhook sinks; grants every other scope.
    Admin,
}

impl Scope {
    /// Every scope, for messages.
    pub const ALL: [Scope; 3] = [Scope::Ingest, Scope::Read, Scope::Admin];

    fn bit(self) -> u8 {
        match self {
            Scope::Ingest => 1,
            Scope::Read => 2,
            Scope::Admin => 4,
        }
    }

    /// The scope's name in config and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Ingest => "ingest",
            Scope::Read => "read",
            Scope::Admin => "admin",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Scope, String> {
        Scope::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| format!("unknown scope {s:?}; known: ingest, read, admin"))
    }
}

/// A set of scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scopes(u8);

impl Scopes {
    /// Adds `s`.
    pub fn with(self, s: Scope) -> Scopes {
        Scopes(self.0 | s.bit())
    }

    /// Whether these scopes allow `need` (`admin` allows everything).
    pub fn allows(self, need: Scope) -> bool {
        self.0 & (need.bit() | Scope::Admin.bit()) != 0
    }

    /// Whether empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The scopes' names, in `ingest, read, admin` order.
    pub fn names(self) -> Vec<&'static str> {
        Scope::ALL
            .into_iter()
            .filter(|s| self.0 & s.bit() != 0)
            .map(Scope::as_str)
            .collect()
    }
}

/// Shortest accepted secret: 16 characters of the URL-safe alphabet is at least 96 bits when
/// generated randomly (`openssl rand -hex 16` gives 32).
pub const MIN_SECRET_LEN: usize = 16;

/// One configured key.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// Name for logs and metrics (never the secret).
    pub name: String,
    /// What it may do.
    pub scopes: Scopes,
    /// SHA-256 of the secret.
    pub digest: [u8; 32],
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiKey")
            .field("name", &self.name)
            .field("scopes", &self.scopes.names())
            .finish_non_exhaustive()
    }
}

/// SHA-256 of a secret, as held in [`ApiKey::digest`].
pub fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Checks a secret's alphabet and length. URL-safe characters only, because trackers that
/// cannot send headers (Traccar Client, OsmAnd) pass the key in the query string.
pub fn check_secret(secret: &str) -> Result<(), String> {
    if secret.len() < MIN_SECRET_LEN {
        return Err(format!(
            "key must be at least {MIN_SECRET_LEN} characters, got {}",
            secret.len()
        ));
    }
    if let Some(c) = secret
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~')))
    {
        return Err(format!(
            "key may only hold A-Z a-z 0-9 - _ . ~ (it may travel in a URL), found {c:?}"
        ));
    }
    Ok(())
}

/// Parses a hex SHA-256 digest (`key_sha256`).
pub fn parse_digest(hex: &str) -> Result<[u8; 32], String> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("key_sha256 must be 64 hex digits (sha256sum of the key)".into());
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AuthError {
    /// No token was presented (401).
    #[error("this endpoint needs an API key: send `Authorization: Bearer <key>`")]
    Missing,
    /// The token matches no key (401).
    #[error("the API key is not valid")]
    Invalid,
    /// The key is valid but lacks the scope (403).
    #[error("API key {key:?} lacks the {need} scope (it has: {has})")]
    Forbidden {
        /// The key's name.
        key: String,
        /// The scope needed.
        need: Scope,
        /// The key's scopes.
        has: String,
    },
}

/// The configured keys.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Keys {
    keys: Vec<ApiKey>,
}

impl Keys {
    /// Holds `keys`.
    pub fn new(keys: Vec<ApiKey>) -> Keys {
        Keys { keys }
    }

    /// Whether authentication is on (at least one key).
    pub fn enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The keys.
    pub fn keys(&self) -> &[ApiKey] {
        &self.keys
    }

    /// The key `token` is, if any. Visits every key whatever matches.
    pub fn identify(&self, token: &str) -> Option<&ApiKey> {
        let d = digest(token);
        let mut found = None;
        for k in &self.keys {
            if bool::from(k.digest.ct_eq(&d)) && found.is_none() {
                found = Some(k);
            }
        }
        found
    }

    /// Whether `token` (None: none presented) may do what `need` names. Always allowed when
    /// authentication is off. Returns the key's name when one was used.
    pub fn check(&self, token: Option<&str>, need: Scope) -> Result<Option<&str>, AuthError> {
        if !self.enabled() {
            return Ok(None);
        }
        let token = token.ok_or(AuthError::Missing)?;
        let key = self.identify(token).ok_or(AuthError::Invalid)?;
        if key.scopes.allows(need) {
            Ok(Some(&key.name))
        } else {
            Err(AuthError::Forbidden {
                key: key.name.clone(),
                need,
                has: key.scopes.names().join(", "),
            })
        }
    }
}

/// Parses `GEODWELL_API_KEYS`: `name:scope+scope:secret` entries separated by commas.
pub fn parse_env_keys(spec: &str) -> Result<Vec<ApiKey>, Vec<String>> {
    let mut keys = Vec::new();
    let mut errors = Vec::new();
    for (i, entry) in spec.split(',').map(str::trim).enumerate() {
        if entry.is_empty() {
            continue;
        }
        let mut parts = entry.splitn(3, ':');
        let (Some(name), Some(scopes), Some(secret)) = (parts.next(), parts.next(), parts.next())
        else {
            errors.push(format!(
                "entry {i}: expected name:scope+scope:key, got {} part(s)",
                entry.split(':').count()
            ));
            continue;
        };
        match build_key(name, scopes.split('+'), Some(secret), None) {
            Ok(k) => keys.push(k),
            Err(e) => errors.extend(e.into_iter().map(|m| format!("entry {i} ({name}): {m}"))),
        }
    }
    if errors.is_empty() {
        Ok(keys)
    } else {
        Err(errors)
    }
}

/// Builds one key from its parts, collecting every problem.
pub fn build_key<'a>(
    name: &str,
    scopes: impl IntoIterator<Item = &'a str>,
    secret: Option<&str>,
    secret_sha256: Option<&str>,
) -> Result<ApiKey, Vec<String>> {
    let mut errors = Vec::new();
    if name.trim().is_empty() {
        errors.push("name must not be empty".to_string());
    }
    let mut set = Scopes::default();
    let before = errors.len();
    for s in scopes {
        match s.trim().parse::<Scope>() {
            Ok(s) => set = set.with(s),
            Err(e) => errors.push(e),
        }
    }
    if set.is_empty() && errors.len() == before {
        errors.push("scopes must name at least one of ingest, read, admin".into());
    }
    let digest = match (secret, secret_sha256) {
        (Some(_), Some(_)) => {
            errors.push("give key or key_sha256, not both".into());
            None
        }
        (Some(s), None) => match check_secret(s) {
            Ok(()) => Some(digest(s)),
            Err(e) => {
                errors.push(e);
                None
            }
        },
        (None, Some(h)) => match parse_digest(h) {
            Ok(d) => Some(d),
            Err(e) => {
                errors.push(e);
                None
            }
        },
        (None, None) => {
            errors.push("needs key or key_sha256".into());
            None
        }
    };
    match digest {
        Some(digest) if errors.is_empty() => Ok(ApiKey {
            name: name.trim().to_string(),
            scopes: set,
            digest,
        }),
        _ => Err(errors),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::new(
            parse_env_keys("ops:admin:0123456789abcdef,trk:ingest:fedcba9876543210,dash:read+ingest:aaaaaaaaaaaaaaaa")
                .unwrap(),
        )
    }

    #[test]
    fn off_without_keys() {
        assert_eq!(Keys::default().check(None, Scope::Admin), Ok(None));
    }

    #[test]
    fn scopes_are_enforced_and_admin_implies_all() {
        let k = keys();
        assert_eq!(k.check(None, Scope::Read), Err(AuthError::Missing));
        assert_eq!(
            k.check(Some("nope-nope-nope-nope"), Scope::Read),
            Err(AuthError::Invalid)
        );
        assert_eq!(
            k.check(Some("0123456789abcdef"), Scope::Ingest),
            Ok(Some("ops"))
        );
        assert_eq!(
            k.check(Some("0123456789abcdef"), Scope::Read),
            Ok(Some("ops"))
        );
        assert_eq!(
            k.check(Some("fedcba9876543210"), Scope::Ingest),
            Ok(Some("trk"))
        );
        assert!(matches!(
            k.check(Some("fedcba9876543210"), Scope::Read),
            Err(AuthError::Forbidden {
                need: Scope::Read,
                ..
            })
        ));
        assert_eq!(
            k.check(Some("aaaaaaaaaaaaaaaa"), Scope::Read),
            Ok(Some("dash"))
        );
        assert!(matches!(
            k.check(Some("aaaaaaaaaaaaaaaa"), Scope::Admin),
            Err(AuthError::Forbidden { .. })
        ));
        // A prefix or extension of a key is not the key.
        assert_eq!(
            k.check(Some("0123456789abcde"), Scope::Read),
            Err(AuthError::Invalid)
        );
        assert_eq!(
            k.check(Some("0123456789abcdef0"), Scope::Read),
            Err(AuthError::Invalid)
        );
    }

    #[test]
    fn digests_configure_keys_without_the_secret() {
        let hex: String = digest("0123456789abcdef")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let k = Keys::new(vec![build_key("ops", ["read"], None, Some(&hex)).unwrap()]);
        assert_eq!(
            k.check(Some("0123456789abcdef"), Scope::Read),
            Ok(Some("ops"))
        );
        assert!(build_key("ops", ["read"], None, Some("abc")).is_err());
    }

    #[test]
    fn bad_specs_report_every_problem() {
        let e = parse_env_keys("a:read:short,b:root:0123456789abcdef,c:read").unwrap_err();
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e[0].contains("at least 16"), "{e:?}");
        assert!(e[1].contains("unknown scope"), "{e:?}");
        assert!(e[2].contains("expected name:scope+scope:key"), "{e:?}");
        let e = build_key("", ["read"], Some("has space in it!!"), None).unwrap_err();
        assert_eq!(e.len(), 2, "{e:?}");
    }

    #[test]
    fn debug_never_prints_the_digest() {
        let k = keys();
        let s = format!("{k:?}");
        assert!(s.contains("ops") && !s.contains("digest"), "{s}");
    }
}
