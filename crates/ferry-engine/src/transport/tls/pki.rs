//! A throwaway public-key infrastructure for tests and demos: one CA and one
//! certificate that both ends of a migration on this machine can use.
//!
//! The certificate serves and dials (both extended key usages) and names
//! `localhost`, `127.0.0.1`, `::1` and whatever else the caller adds. Fleets
//! use their own CA: put its `ca.pem`, and each host's `cert.pem` and
//! `key.pem`, in each host's `--tls-dir`.

use super::{TlsError, CA_FILE, CERT_FILE, KEY_FILE};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Names every throwaway certificate carries.
pub const LOCAL_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Writes `ca.pem`, `cert.pem` and `key.pem` (mode 0600) into `dir`,
/// creating it. The certificate names [`LOCAL_NAMES`] and `extra_names`.
/// Refuses to overwrite existing files.
pub fn write_throwaway(dir: &Path, extra_names: &[String]) -> Result<(), TlsError> {
    for f in [CA_FILE, CERT_FILE, KEY_FILE] {
        let path = dir.join(f);
        if path.exists() {
            return Err(TlsError::Exists { path });
        }
    }
    let gen = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let ca_key = KeyPair::generate().map_err(gen)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(gen)?;
    // A name of its own, so a peer holding another throwaway CA reports an
    // unknown issuer rather than a bad signature.
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    ca.distinguished_name.push(
        DnType::CommonName,
        format!("ferry throwaway CA {:x}-{nonce:x}", std::process::id()),
    );
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).map_err(gen)?;
    let issuer = Issuer::new(ca, ca_key);

    let mut names: Vec<String> = LOCAL_NAMES.iter().map(|s| s.to_string()).collect();
    for n in extra_names {
        if !names.contains(n) {
            names.push(n.clone());
        }
    }
    let mut leaf = CertificateParams::new(names).map_err(gen)?;
    leaf.distinguished_name
        .push(DnType::CommonName, "ferry migration peer");
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let leaf_key = KeyPair::generate().map_err(gen)?;
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).map_err(gen)?;

    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    write(dir, CA_FILE, &ca_cert.pem(), 0o644)?;
    write(dir, CERT_FILE, &leaf_cert.pem(), 0o644)?;
    write(dir, KEY_FILE, &leaf_key.serialize_pem(), 0o600)
}

fn write(dir: &Path, name: &str, text: &str, mode: u32) -> Result<(), TlsError> {
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&path)
        .map_err(|source| TlsError::Write {
            path: path.clone(),
            source,
        })?;
    f.write_all(text.as_bytes())
        .map_err(|source| TlsError::Write { path, source })
}
