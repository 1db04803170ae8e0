//! Serving certificate hot reload. Kubernetes updates a mounted Secret by swapping a symlink, and
//! a rotation may write the certificate and the key at different moments; so the files are polled,
//! and a new pair is only swapped in once both parse and the key matches the certificate. Until
//! then every handshake keeps getting the previous, still valid pair.

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::CertError;

/// What a reload attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// The files hold what is already served.
    Unchanged,
    /// A new certificate is now served.
    Reloaded,
}

/// A rustls resolver serving the certificate currently on disk.
pub struct ReloadingCertResolver {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: ArcSwap<Served>,
    /// The file contents behind `current`, to detect change cheaply.
    loaded_bytes: Mutex<(Vec<u8>, Vec<u8>)>,
}

/// The pair in service, with its leaf's expiry read once.
struct Served {
    key: Arc<CertifiedKey>,
    /// notAfter of the leaf, Unix seconds; `None` if it could not be parsed.
    not_after: Option<i64>,
}

impl Served {
    fn new(key: CertifiedKey, cert_path: &Path) -> Self {
        let not_after = key.cert.first().and_then(|leaf| {
            match x509_parser::parse_x509_certificate(leaf.as_ref()) {
                Ok((_, parsed)) => Some(parsed.validity().not_after.timestamp()),
                Err(error) => {
                    tracing::warn!(cert = %cert_path.display(), %error, "cannot read the certificate's expiry");
                    None
                }
            }
        });
        Self {
            key: Arc::new(key),
            not_after,
        }
    }
}

impl std::fmt::Debug for ReloadingCertResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCertResolver")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

impl ReloadingCertResolver {
    /// Loads the pair once; fails if it is unusable, so a misconfigured server never starts.
    pub fn load(
        cert_path: impl Into<PathBuf>,
        key_path: impl Into<PathBuf>,
    ) -> Result<Self, CertError> {
        let cert_path = cert_path.into();
        let key_path = key_path.into();
        let (cert_bytes, key_bytes) = read_pair(&cert_path, &key_path)?;
        let certified = certified_key(&cert_path, &cert_bytes, &key_path, &key_bytes)?;
        Ok(Self {
            current: ArcSwap::from_pointee(Served::new(certified, &cert_path)),
            cert_path,
            key_path,
            loaded_bytes: Mutex::new((cert_bytes, key_bytes)),
        })
    }

    /// Re-reads the files and swaps in a new pair if they changed and are consistent.
    /// On error the previous pair stays in service.
    pub fn reload(&self) -> Result<ReloadOutcome, CertError> {
        let (cert_bytes, key_bytes) = read_pair(&self.cert_path, &self.key_path)?;
        let mut loaded = self
            .loaded_bytes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if loaded.0 == cert_bytes && loaded.1 == key_bytes {
            return Ok(ReloadOutcome::Unchanged);
        }
        let certified = certified_key(&self.cert_path, &cert_bytes, &self.key_path, &key_bytes)?;
        self.current
            .store(Arc::new(Served::new(certified, &self.cert_path)));
        *loaded = (cert_bytes, key_bytes);
        Ok(ReloadOutcome::Reloaded)
    }

    /// The DER leaf certificate currently served.
    pub fn current_leaf(&self) -> Option<CertificateDer<'static>> {
        self.current.load().key.cert.first().cloned()
    }

    /// When the certificate currently served expires (its notAfter, Unix seconds), for the
    /// expiry metric; `None` if it could not be parsed.
    pub fn not_after(&self) -> Option<i64> {
        self.current.load().not_after
    }

    /// Polls the files every `interval` until `shutdown` resolves. Reload errors are logged, not
    /// fatal: a half-written rotation is picked up at a later tick. A zero interval is refused
    /// (it would mean a busy loop).
    pub async fn watch(
        self: Arc<Self>,
        interval: Duration,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), CertError> {
        if interval.is_zero() {
            return Err(CertError::ZeroReloadInterval);
        }
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                _ = ticker.tick() => {}
            }
            let this = Arc::clone(&self);
            let result = tokio::task::spawn_blocking(move || this.reload()).await;
            match result {
                Ok(Ok(ReloadOutcome::Reloaded)) => {
                    tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded");
                }
                Ok(Ok(ReloadOutcome::Unchanged)) => {}
                Ok(Err(error)) => {
                    tracing::warn!(%error, "serving certificate not reloaded; the previous one stays in service");
                }
                Err(error) => tracing::error!(%error, "certificate reload task failed"),
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCertResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.current.load().key))
    }
}

fn read_pair(cert_path: &Path, key_path: &Path) -> Result<(Vec<u8>, Vec<u8>), CertError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| CertError::Read {
            path: path.display().to_string(),
            source,
        })
    };
    Ok((read(cert_path)?, read(key_path)?))
}

fn certified_key(
    cert_path: &Path,
    cert_bytes: &[u8],
    key_path: &Path,
    key_bytes: &[u8],
) -> Result<CertifiedKey, CertError> {
    let chain = rustls_pemfile::certs(&mut BufReader::new(cert_bytes))
        .collect::<Result<Vec<CertificateDer<'static>>, _>>()
        .map_err(|source| CertError::Pem {
            path: cert_path.display().to_string(),
            source,
        })?;
    if chain.is_empty() {
        return Err(CertError::MissingPem {
            path: cert_path.display().to_string(),
            what: "certificate",
        });
    }
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut BufReader::new(key_bytes))
        .map_err(|source| CertError::Pem {
            path: key_path.display().to_string(),
            source,
        })?
        .ok_or_else(|| CertError::MissingPem {
            path: key_path.display().to_string(),
            what: "private key",
        })?;
    let signing_key =
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(CertError::Key)?;
    let certified = CertifiedKey::new(chain, signing_key);
    certified.keys_match().map_err(CertError::KeyMismatch)?;
    Ok(certified)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::CertificateAuthority;

    #[tokio::test]
    async fn a_zero_reload_interval_is_an_error_not_a_panic() {
        let ca = CertificateAuthority::generate("ca", Duration::from_secs(3600)).unwrap();
        let issued = ca
            .issue_serving(&["x"], &[], Duration::from_secs(3600))
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, &issued.cert_pem).unwrap();
        std::fs::write(&key, &issued.key_pem).unwrap();
        let resolver = Arc::new(ReloadingCertResolver::load(&cert, &key).unwrap());
        let watch = tokio::spawn(resolver.watch(Duration::ZERO, std::future::pending()));
        let ended = tokio::time::timeout(Duration::from_secs(10), watch).await;
        assert!(
            matches!(ended, Ok(Ok(Err(CertError::ZeroReloadInterval)))),
            "{ended:?}"
        );
    }
}
