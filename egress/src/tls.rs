//! TLS for the hosts that carry a credential: the sandbox's own CA, which
//! signs a certificate for each such host the moment a connection asks for
//! it, and the proxy's own TLS to the real host, checked against the
//! roots this machine trusts.
//!
//! The CA's key lives in berth's state directory (mode 0600), never in
//! the sandbox: what the sandbox gets is the certificate, in a bundle with
//! the roots the proxy itself trusts ([`Ca::bundle`]), so a program in the
//! sandbox checks every other host's certificate exactly as before.

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// A sandbox's CA, and the certificates it has signed for hosts.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
    pem: String,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl Ca {
    /// The CA whose key is at `key_path`, made (and the key written, mode
    /// 0600) when there is none. `label` names the sandbox in the
    /// certificate's subject.
    pub fn load_or_make(key_path: &Path, label: &str) -> io::Result<Ca> {
        let key = match std::fs::read_to_string(key_path) {
            Ok(text) => KeyPair::from_pem(&text).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} is not a key berth can read ({e}); remove it and berth makes a new CA",
                        key_path.display()
                    ),
                )
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let key = KeyPair::generate().map_err(io::Error::other)?;
                if let Some(dir) = key_path.parent() {
                    std::fs::create_dir_all(dir)?;
                    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
                }
                let tmp = key_path.with_extension("tmp");
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)?;
                f.write_all(key.serialize_pem().as_bytes())?;
                f.sync_all()?;
                std::fs::rename(&tmp, key_path)?;
                key
            }
            Err(e) => return Err(e),
        };
        // The same key and subject make an equivalent certificate each
        // time: a bundle written earlier still checks what is signed now.
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "berth");
        dn.push(
            DnType::CommonName,
            format!("berth egress CA for sandbox {label}"),
        );
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = rcgen::date_time_ymd(2025, 1, 1);
        params.not_after = rcgen::date_time_ymd(2100, 1, 1);
        let cert = params.self_signed(&key).map_err(io::Error::other)?;
        Ok(Ca {
            pem: cert.pem(),
            cert: cert.der().clone(),
            issuer: Issuer::new(params, key),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA's certificate, DER (for a trust store).
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert
    }

    /// The CA's certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.pem
    }

    /// What the sandbox trusts: `roots` (the proxy's own, PEM) and this CA.
    pub fn bundle(&self, roots: &[CertificateDer<'static>]) -> String {
        let mut out = String::new();
        for r in roots {
            out.push_str(&pem_of(r));
        }
        out.push_str(&self.pem);
        out
    }

    /// The TLS server setup that shows the sandbox a certificate for
    /// `host`, signed by this CA (made once per host, then kept).
    pub fn server_for(&self, host: &str) -> Result<Arc<ServerConfig>, String> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = leaves.get(host) {
            return Ok(c.clone());
        }
        let key = KeyPair::generate().map_err(|e| e.to_string())?;
        let mut params = CertificateParams::new(vec![host.to_string()])
            .map_err(|e| format!("no certificate can name `{host}`: {e}"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        params.distinguished_name = dn;
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(90);
        let leaf = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| e.to_string())?;
        let chain = vec![leaf.der().clone(), self.cert.clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut cfg = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| e.to_string())?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        leaves.insert(host.to_string(), cfg.clone());
        Ok(cfg)
    }
}

/// The roots the proxy checks hosts against: this machine's (the system's
/// store, or `SSL_CERT_FILE`/`SSL_CERT_DIR` when set), else the Mozilla
/// set berth carries.
pub fn roots() -> Vec<CertificateDer<'static>> {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::debug!(error = %e, "a system root certificate could not be read");
    }
    if !found.certs.is_empty() {
        return found.certs;
    }
    tracing::warn!("no system root certificates found; the egress proxy uses the Mozilla set");
    Vec::new()
}

/// The proxy's TLS client: `roots` (or the Mozilla set when empty), HTTP/1.1.
pub fn client(roots: &[CertificateDer<'static>]) -> Result<Arc<ClientConfig>, String> {
    let mut store = RootCertStore::empty();
    if roots.is_empty() {
        store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    } else {
        let (_, bad) = store.add_parsable_certificates(roots.iter().cloned());
        if bad > 0 {
            tracing::debug!(
                count = bad,
                "root certificates rustls cannot use were left out"
            );
        }
    }
    let mut cfg = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(store)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// One certificate as PEM.
fn pem_of(der: &CertificateDer<'_>) -> String {
    pem::encode_config(
        &pem::Pem::new("CERTIFICATE", der.as_ref().to_vec()),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_keeps_its_key_private_and_signs_for_a_host() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let key = dir.path().join("keys").join("ca.key");
        let ca = Ca::load_or_make(&key, "docker-s1")?;
        let mode = std::fs::metadata(&key)?.permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(std::fs::read_to_string(&key)?.contains("PRIVATE KEY"));
        assert!(!ca.cert_pem().contains("PRIVATE KEY"));
        // Loaded again, it is the same CA (same key, same subject).
        let again = Ca::load_or_make(&key, "docker-s1")?;
        assert_eq!(
            again.issuer.key().serialize_der(),
            ca.issuer.key().serialize_der()
        );
        assert!(ca.server_for("api.test").is_ok());
        assert!(ca.server_for("na\u{ef}ve.test").is_err());
        let bundle = ca.bundle(std::slice::from_ref(&ca.cert));
        assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), 2);
        // Our PEM reads back as the same certificate.
        assert!(bundle.starts_with(ca.cert_pem()));
        std::fs::write(&key, "junk")?;
        assert!(
            Ca::load_or_make(&key, "docker-s1").is_err_and(|e| e.to_string().contains("remove it"))
        );
        Ok(())
    }
}
