//! TLS with rustls and the ring provider: a certificate from PEM files, or a self-signed one that
//! is generated once, kept in the data directory and reused across restarts, so peers can pin
//! its SHA-256 fingerprint.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::TlsMode;

/// Self-signed certificate file inside the data directory.
pub const SELF_SIGNED_CERT: &str = "tls/self-signed.cert.pem";
/// Its private key (mode 0600).
pub const SELF_SIGNED_KEY: &str = "tls/self-signed.key.pem";

/// Why TLS could not be set up (operator's fault: files, permissions, bad PEM).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Reading or writing a certificate or key file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A PEM file could not be parsed.
    #[error("{path}: {source}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: rustls::pki_types::pem::Error,
    },
    /// The certificate file holds no certificate.
    #[error("{0}: no certificate found")]
    NoCertificate(PathBuf),
    /// rustls refused the certificate or key.
    #[error("tls configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// Generating a self-signed certificate failed.
    #[error("generating a self-signed certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// A ready server configuration.
#[derive(Debug)]
pub struct Loaded {
    /// For axum-server.
    pub server_config: Arc<ServerConfig>,
    /// SHA-256 of the leaf certificate's DER.
    pub cert_sha256: [u8; 32],
}

/// Installs ring as the process's default rustls provider (the workspace builds rustls without
/// aws-lc). Calling it again is harmless.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Loads or creates what `mode` asks for; `None` for plain HTTP.
pub fn load(mode: &TlsMode, data_dir: &Path, listen: SocketAddr) -> Result<Option<Loaded>, TlsError> {
    let (certs, key) = match mode {
        TlsMode::Plain => return Ok(None),
        TlsMode::Files { cert, key } => (read_certs(cert)?, read_key(key)?),
        TlsMode::SelfSigned => self_signed(data_dir, listen)?,
    };
    let leaf = certs.first().ok_or_else(|| match mode {
        TlsMode::Files { cert, .. } => TlsError::NoCertificate(cert.clone()),
        _ => TlsError::NoCertificate(data_dir.join(SELF_SIGNED_CERT)),
    })?;
    let cert_sha256 = switchboard_core::util::sha256(leaf.as_ref());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    // The relay speaks HTTP/1.1 only (websockets upgrade over it).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(Loaded { server_config: Arc::new(config), cert_sha256 }))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |source| TlsError::Pem { path: path.to_owned(), source };
    CertificateDer::pem_file_iter(path).map_err(pem)?.collect::<Result<Vec<_>, _>>().map_err(pem)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| TlsError::Pem { path: path.to_owned(), source })
}

/// Reuses the stored self-signed certificate, or makes one for localhost, 127.0.0.1, ::1 and
/// the listen address (when it is a specific address).
fn self_signed(
    data_dir: &Path,
    listen: SocketAddr,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let cert_path = data_dir.join(SELF_SIGNED_CERT);
    let key_path = data_dir.join(SELF_SIGNED_KEY);
    if cert_path.exists() && key_path.exists() {
        return Ok((read_certs(&cert_path)?, read_key(&key_path)?));
    }
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()];
    let ip = listen.ip();
    if !ip.is_unspecified() && !names.contains(&ip.to_string()) {
        names.push(ip.to_string());
    }
    let generated = rcgen::generate_simple_self_signed(names)?;
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| TlsError::Io { path, source }
    };
    if let Some(dir) = key_path.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    // Key first, certificate last: a certificate file on disk means both are complete.
    write_file(&key_path, generated.signing_key.serialize_pem().as_bytes(), true).map_err(io(&key_path))?;
    write_file(&cert_path, generated.cert.pem().as_bytes(), false).map_err(io(&cert_path))?;
    tracing::info!(cert = %cert_path.display(), "generated a self-signed certificate");
    let key = PrivateKeyDer::try_from(generated.signing_key.serialize_der())
        .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_owned())))?;
    Ok((vec![generated.cert.der().clone()], key))
}

/// Writes `data` via a temporary file and a rename; `secret` files get mode 0600.
fn write_file(path: &Path, data: &[u8], secret: bool) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(&tmp)?;
    file.write_all(data)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_certificate_is_reused_across_loads() {
        let dir = tempfile::tempdir().unwrap();
        let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let first = load(&TlsMode::SelfSigned, dir.path(), listen).unwrap().unwrap();
        let second = load(&TlsMode::SelfSigned, dir.path(), listen).unwrap().unwrap();
        assert_eq!(first.cert_sha256, second.cert_sha256);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(dir.path().join(SELF_SIGNED_KEY)).unwrap().permissions();
            assert_eq!(mode.mode() & 0o777, 0o600);
        }
    }
}
