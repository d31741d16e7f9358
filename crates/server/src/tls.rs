//! O1: serve's own HTTPS (rustls). The certificate and key are read at start and again whenever
//! either file changes on disk, so a renewed certificate is served without a restart; a broken
//! pair on disk — or one expired or not yet valid (T17) — is logged once per change and the one
//! in force keeps serving.

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
    #[error("TLS certificate {path}: {problem}")]
    Unservable { path: PathBuf, problem: pcmail_core::certificate::Unservable },
}

/// T17: what every answer under TLS carries, so a browser comes back only over HTTPS.
pub const HSTS: &str = "max-age=31536000";

/// When the certificate and key files were last modified, as read with them.
type Stamps = Option<(SystemTime, SystemTime)>;

/// The certificate in force, swapped whole when the files change.
#[derive(Debug)]
pub struct Certificate {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<(Arc<CertifiedKey>, Stamps)>,
    /// The served certificate's `notAfter` (T17's metric).
    expires_at: RwLock<pcmail_core::Ts>,
}

impl Certificate {
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Certificate>, TlsError> {
        let (pair, expires_at) = read_pair(cert, key)?;
        let stamps = stamps(cert, key);
        Ok(Arc::new(Certificate {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: RwLock::new((Arc::new(pair), stamps)),
            expires_at: RwLock::new(expires_at),
        }))
    }

    pub fn expires_at(&self) -> pcmail_core::Ts {
        *self.expires_at.read().unwrap_or_else(PoisonError::into_inner)
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

    /// Reloads the pair if either file changed since `seen` (the stamps last looked at, loaded
    /// or refused); answers the files' stamps now and whether they were loaded.
    pub fn reload_if_changed(&self, seen: Stamps) -> (Stamps, Result<bool, TlsError>) {
        let now = stamps(&self.cert, &self.key);
        if now.is_none() || now == seen {
            return (seen, Ok(false));
        }
        match read_pair(&self.cert, &self.key) {
            Ok((pair, expires_at)) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = (Arc::new(pair), now);
                *self.expires_at.write().unwrap_or_else(PoisonError::into_inner) = expires_at;
                (now, Ok(true))
            }
            Err(e) => (now, Err(e)),
        }
    }

    /// Looks at the files every `every` until the process ends; `expiry` shows when the served
    /// certificate expires. A refused pair is logged once, until the files change again.
    pub async fn watch(self: Arc<Self>, every: Duration, expiry: prometheus::IntGauge) {
        let mut seen = self.current.read().unwrap_or_else(PoisonError::into_inner).1;
        expiry.set(self.expires_at().timestamp());
        loop {
            tokio::time::sleep(every).await;
            let (now, outcome) = self.reload_if_changed(seen);
            seen = now;
            match outcome {
                Ok(true) => {
                    expiry.set(self.expires_at().timestamp());
                    tracing::info!(cert = %self.cert.display(), expires = %self.expires_at(), "TLS certificate reloaded");
                }
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

/// The pair, if it may be served now (T17), and when its certificate expires.
fn read_pair(cert: &Path, key: &Path) -> Result<(CertifiedKey, pcmail_core::Ts), TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| TlsError::Cert { path: cert.to_path_buf(), message: e.to_string() })?;
    if chain.is_empty() {
        return Err(TlsError::Cert { path: cert.to_path_buf(), message: "no certificate in the file".into() });
    }
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsError::Key { path: key.to_path_buf(), message: e.to_string() })?;
    let unservable = |problem| TlsError::Unservable { path: cert.to_path_buf(), problem };
    let window = pcmail_core::certificate::validity(&chain[0]).map_err(unservable)?;
    pcmail_core::certificate::check_validity(window, crate::clock::now()).map_err(unservable)?;
    let provider = rustls::crypto::ring::default_provider();
    let pair = CertifiedKey::from_der(chain, key_der, &provider).map_err(|e| TlsError::Pair(e.to_string()))?;
    Ok((pair, window.1))
}
