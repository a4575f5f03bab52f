//! TLS for the HTTP server (`server.tls_cert`, `server.tls_key`): the certificate chain and key
//! are read from PEM files at start and again on SIGHUP ([`Tls::reload`], from the paths the
//! reloaded configuration names); connections accepted after a reload use the new ones, open
//! connections keep theirs.
//!
//! Invariants: a certificate is used only while it is valid: a leaf certificate that has
//! expired or is not yet valid refuses the start, and a reload to one changes nothing (every
//! handshake would fail with it, and clients would see a broken service instead of a warning).
//! A reload that fails (a file missing, not PEM, a key that does not match the certificate)
//! changes nothing. The leaf's expiry is the gauge `geodwell_tls_cert_expiry_timestamp_seconds`,
//! for alerting before it comes. The handshake runs in the connection's own task, bounded by the
//! header timeout, so a client that stalls it holds one connection slot, never the accept loop.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file could not be read or holds no PEM certificate.
    #[error("server.tls_cert {path}: {message}")]
    Cert {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The key file could not be read or holds no PEM private key.
    #[error("server.tls_key {path}: {message}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the pair (e.g. the key does not match the certificate).
    #[error("server.tls_cert and server.tls_key do not make a usable certificate: {0}")]
    Config(#[source] rustls::Error),
    /// The leaf certificate is outside its validity period now.
    #[error(
        "server.tls_cert {path}: the certificate is valid from {not_before} to {not_after} (UTC), not now ({now})"
    )]
    NotValidNow {
        /// The file.
        path: PathBuf,
        /// Start of validity (RFC 3339).
        not_before: String,
        /// End of validity (RFC 3339).
        not_after: String,
        /// The time it was checked at (RFC 3339).
        now: String,
    },
}

/// The server's TLS configuration, swapped whole on a reload.
#[derive(Debug)]
pub struct Tls {
    current: RwLock<Loaded>,
}

#[derive(Debug, Clone)]
struct Loaded {
    cert: PathBuf,
    key: PathBuf,
    config: Arc<ServerConfig>,
}

/// What a successful load or reload put in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The certificate file.
    pub cert: PathBuf,
    /// The leaf certificate's end of validity, Unix seconds.
    pub not_after: i64,
}

impl Tls {
    /// Reads `cert` (a PEM chain, leaf first) and `key` (a PEM private key: PKCS#8, PKCS#1 or
    /// SEC1), refusing a leaf certificate that is not valid now.
    pub fn load(cert: &Path, key: &Path) -> Result<Tls, TlsError> {
        let (config, not_after) = build(cert, key, unix_now())?;
        publish_expiry(not_after);
        Ok(Tls {
            current: RwLock::new(Loaded {
                cert: cert.to_path_buf(),
                key: key.to_path_buf(),
                config: Arc::new(config),
            }),
        })
    }

    /// Reads `cert` and `key` (the reloaded configuration's paths, which may differ from those
    /// in use); on success new connections use them, on any error nothing changes.
    pub fn reload(&self, cert: &Path, key: &Path) -> Result<Installed, TlsError> {
        let (config, not_after) = build(cert, key, unix_now())?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Loaded {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            config: Arc::new(config),
        };
        publish_expiry(not_after);
        Ok(Installed {
            cert: cert.to_path_buf(),
            not_after,
        })
    }

    /// The certificate and key files in use.
    pub fn paths(&self) -> (PathBuf, PathBuf) {
        let l = self.current.read().unwrap_or_else(|p| p.into_inner());
        (l.cert.clone(), l.key.clone())
    }

    /// The acceptor for the next connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let config = self
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .config
            .clone();
        tokio_rustls::TlsAcceptor::from(config)
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn publish_expiry(not_after: i64) {
    metrics::gauge!(crate::telemetry::TLS_CERT_EXPIRY).set(not_after as f64);
}

fn rfc3339(unix: i64) -> String {
    chrono::DateTime::from_timestamp(unix, 0).map_or_else(|| unix.to_string(), |t| t.to_rfc3339())
}

/// The leaf's validity period as Unix seconds (`not_before`, `not_after`).
fn validity(leaf: &CertificateDer<'_>, path: &Path) -> Result<(i64, i64), TlsError> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).map_err(|e| TlsError::Cert {
        path: path.to_path_buf(),
        message: format!("the first certificate cannot be read as X.509: {e}"),
    })?;
    let v = cert.validity();
    Ok((v.not_before.timestamp(), v.not_after.timestamp()))
}

/// The configuration of `cert` and `key`, and the leaf's end of validity, checked at `now`.
fn build(cert: &Path, key: &Path, now: i64) -> Result<(ServerConfig, i64), TlsError> {
    let cert_err = |message: String| TlsError::Cert {
        path: cert.to_path_buf(),
        message,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| cert_err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| cert_err(e.to_string()))?;
    let Some(leaf) = chain.first() else {
        return Err(cert_err("no PEM certificate in it".into()));
    };
    let (not_before, not_after) = validity(leaf, cert)?;
    if now < not_before || now > not_after {
        return Err(TlsError::NotValidNow {
            path: cert.to_path_buf(),
            not_before: rfc3339(not_before),
            not_after: rfc3339(not_after),
            now: rfc3339(now),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        path: key.to_path_buf(),
        message: e.to_string(),
    })?;
    // Both providers are compiled into the tree (reqwest brings aws-lc-rs): name one.
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(TlsError::Config)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((config, not_after))
}
