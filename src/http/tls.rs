//! TLS for the HTTP server (`server.tls_cert`, `server.tls_key`): the certificate chain and key
//! are read from PEM files at start and again on SIGHUP ([`Tls::reload`]); connections accepted
//! after a reload use the new ones, open connections keep theirs.
//!
//! Invariants: a reload that fails (a file missing, not PEM, a key that does not match the
//! certificate) changes nothing; the handshake runs in the connection's own task, bounded by the
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
    Config(String),
}

/// The server's TLS configuration, swapped whole on a reload.
#[derive(Debug)]
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<ServerConfig>>,
}

impl Tls {
    /// Reads `cert` (a PEM chain, leaf first) and `key` (a PEM private key: PKCS#8, PKCS#1 or
    /// SEC1).
    pub fn load(cert: &Path, key: &Path) -> Result<Tls, TlsError> {
        let config = build(cert, key)?;
        Ok(Tls {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: RwLock::new(Arc::new(config)),
        })
    }

    /// Reads the files again; on success new connections use them.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = build(&self.cert, &self.key)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
        Ok(())
    }

    /// The acceptor for the next connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let config = self
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        tokio_rustls::TlsAcceptor::from(config)
    }
}

fn build(cert: &Path, key: &Path) -> Result<ServerConfig, TlsError> {
    let cert_err = |message: String| TlsError::Cert {
        path: cert.to_path_buf(),
        message,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| cert_err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| cert_err(e.to_string()))?;
    if chain.is_empty() {
        return Err(cert_err("no PEM certificate in it".into()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        path: key.to_path_buf(),
        message: e.to_string(),
    })?;
    // Both providers are compiled into the tree (reqwest brings aws-lc-rs): name one.
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
