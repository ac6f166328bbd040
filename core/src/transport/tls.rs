//! rustls client configuration: the web PKI roots, or a pinned certificate (SHA-256 of its DER)
//! for a self-signed LAN relay. [`client_config_witnessed`] also remembers a certificate it
//! refused, so the engine can tell a person which one a relay presented.

use std::sync::{Arc, Mutex};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::util::sha256;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts exactly one certificate, by the SHA-256 of its DER encoding. Handshake signatures are
/// still verified, so the peer must hold the certificate's private key.
#[derive(Debug)]
struct PinnedCert {
    sha256: [u8; 32],
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if sha256(end_entity.as_ref()) == self.sha256 {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General("relay certificate does not match the pinned SHA-256".into()))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// A client configuration: pinned when `pin` is given, else the web PKI.
pub fn client_config(pin: Option<[u8; 32]>) -> Result<ClientConfig, rustls::Error> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let config = match pin {
        Some(sha256) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedCert { sha256, provider }))
            .with_no_client_auth(),
        None => {
            let roots = RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    Ok(config)
}

/// The certificate a server presented and the verifier refused (SHA-256 of its DER), if any.
#[derive(Debug, Clone, Default)]
pub struct RefusedCert(Arc<Mutex<Option<[u8; 32]>>>);

impl RefusedCert {
    /// The SHA-256 of the last refused certificate.
    pub fn get(&self) -> Option<[u8; 32]> {
        self.0.lock().ok().and_then(|g| *g)
    }
}

/// Wraps a verifier and records the end-entity certificate it refuses.
#[derive(Debug)]
struct Witnessing {
    inner: Arc<dyn ServerCertVerifier>,
    refused: RefusedCert,
}

impl ServerCertVerifier for Witnessing {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verdict = self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp, now);
        if verdict.is_err()
            && let Ok(mut slot) = self.refused.0.lock()
        {
            *slot = Some(sha256(end_entity.as_ref()));
        }
        verdict
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// [`client_config`] whose verifier remembers a certificate it refused (not the pinned one, or
/// not valid in the web PKI): the engine turns that into "trust this relay?".
pub fn client_config_witnessed(pin: Option<[u8; 32]>) -> Result<(ClientConfig, RefusedCert), rustls::Error> {
    let provider = provider();
    let inner: Arc<dyn ServerCertVerifier> = match pin {
        Some(sha256) => Arc::new(PinnedCert { sha256, provider: provider.clone() }),
        None => {
            let roots = RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| rustls::Error::General(e.to_string()))?
        }
    };
    let refused = RefusedCert::default();
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Witnessing { inner, refused: refused.clone() }))
        .with_no_client_auth();
    Ok((config, refused))
}
