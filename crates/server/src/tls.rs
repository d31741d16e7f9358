//! O1: serve's own HTTPS (rustls). The certificate and key are read at start and again whenever
//! either file changes on disk, so a renewed certificate is served without a restart; a broken
//! pair on disk is logged and the one in force keeps serving.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS certificate {path}: {message}")]
    Cert { path: PathBuf, message: String },
    #[error("TLS key {path}: {message}")]
    Key { path: PathBuf, message: String },
    #[error("TLS certificate and key do not go together: {0}")]
    Pair(String),
}

/// When the certificate and key files were last modified, as read with them.
type Stamps = Option<(SystemTime, SystemTime)>;

/// The certificate in force, swapped whole when the files change.
#[derive(Debug)]
pub struct Certificate {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<(Arc<CertifiedKey>, Stamps)>,
}

impl Certificate {
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Certificate>, TlsError> {
        let pair = read_pair(cert, key)?;
        let stamps = stamps(cert, key);
        Ok(Arc::new(Certificate {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: RwLock::new((Arc::new(pair), stamps)),
        }))
    }

    /// The rustls acceptor serving this certificate (HTTP/1.1 only).
    pub fn acceptor(self: &Arc<Self>) -> tokio_rustls::TlsAcceptor {
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map(|b| b.with_no_client_auth().with_cert_resolver(self.clone()))
                .unwrap_or_else(|_| {
                    rustls::ServerConfig::builder().with_no_client_auth().with_cert_resolver(self.clone())
                });
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }

    /// Reloads the pair if either file changed since it was read; answers whether it did.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = stamps(&self.cert, &self.key);
        let known = self.current.read().unwrap_or_else(PoisonError::into_inner).1;
        if now.is_none() || now == known {
            return Ok(false);
        }
        let pair = read_pair(&self.cert, &self.key)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = (Arc::new(pair), now);
        Ok(true)
    }

    /// Looks at the files every `every` until the process ends.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        loop {
            tokio::time::sleep(every).await;
            match self.reload_if_changed() {
                Ok(true) => tracing::info!(cert = %self.cert.display(), "TLS certificate reloaded"),
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(error = %e, "TLS certificate on disk not loaded; the one in force keeps serving")
                }
            }
        }
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().unwrap_or_else(PoisonError::into_inner).0.clone())
    }
}

fn stamps(cert: &Path, key: &Path) -> Stamps {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((m(cert)?, m(key)?))
}

fn read_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| TlsError::Cert { path: cert.to_path_buf(), message: e.to_string() })?;
    if chain.is_empty() {
        return Err(TlsError::Cert { path: cert.to_path_buf(), message: "no certificate in the file".into() });
    }
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsError::Key { path: key.to_path_buf(), message: e.to_string() })?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key_der, &provider).map_err(|e| TlsError::Pair(e.to_string()))
}
