//! Mutual TLS on every connection: a migration over TLS proves itself like
//! any other, and each kind of mismatched peer is refused with words, before
//! the destination reads any migration data.

mod common;
use common::*;

use ferry_engine::transport::tls::{pki, CA_FILE, CERT_FILE};
use ferry_engine::{
    await_migration, listen, migrate, receive, Dial, Listen, MigrationError, NoProgress,
    ReceiveOptions, TcpDialer, TlsConfig,
};
use ferry_vm::Vm;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A fresh throwaway CA and certificate in a directory of its own.
struct Certs(PathBuf);

impl Certs {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "ferry-tls-test-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        pki::write_throwaway(&dir, &[]).unwrap();
        Certs(dir)
    }
    fn config(&self) -> TlsConfig {
        TlsConfig::load(&self.0).unwrap()
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A destination thread on `listener`; the error of `await_migration` or
/// `receive`, or the summary's TLS flag.
fn destination(listener: Box<dyn Listen + Send>) -> JoinHandle<Result<bool, MigrationError>> {
    std::thread::spawn(move || {
        let incoming = await_migration(&*listener, None)?;
        let mut create = create_test_vm;
        let opts = ReceiveOptions::default();
        let (_vm, s) = receive(incoming, &*listener, &mut create, &opts)?;
        Ok(s.tls)
    })
}

fn tls_destination(certs: &Certs) -> (String, JoinHandle<Result<bool, MigrationError>>) {
    let tcp = listen("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap().to_string();
    (addr, destination(Box::new(certs.config().listener(tcp))))
}

fn plain_destination() -> (String, JoinHandle<Result<bool, MigrationError>>) {
    let tcp = listen("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap().to_string();
    (addr, destination(Box::new(tcp)))
}

/// Migrates a running test VM through `dialer`; the source must keep
/// running whatever happens.
fn migrate_with(dialer: &dyn Dial) -> Result<ferry_engine::MigrationSummary, String> {
    let mut vm = running_source();
    let opts = {
        let mut o = probed();
        o.connections = 2;
        o
    };
    let r = migrate(&mut vm, dialer, &opts, &NoProgress).map_err(|e| ferry_vm::error_chain(&e));
    if r.is_err() {
        assert!(
            vm.is_running(),
            "a failed migration must leave the source running"
        );
        assert_eq!(check(&vm).errors, 0);
    }
    r
}

fn dest_error(h: JoinHandle<Result<bool, MigrationError>>) -> String {
    match h.join().unwrap() {
        Ok(tls) => panic!("the destination accepted the migration (tls {tls})"),
        Err(e) => ferry_vm::error_chain(&e),
    }
}

#[test]
fn a_migration_over_mutual_tls_verifies() {
    let certs = Certs::new("ok");
    let (addr, dest) = tls_destination(&certs);
    let s = migrate_with(&certs.config().dialer(&addr).unwrap()).unwrap();
    assert!(
        s.digest_match && s.guest.guest_mismatches == Some(0),
        "{s:?}"
    );
    assert!(s.link.tls, "the summary must say TLS");
    assert_eq!(s.link.connections, 2);
    assert!(
        dest.join().unwrap().unwrap(),
        "the destination must say TLS"
    );
}

#[test]
fn a_plaintext_source_is_refused_by_a_tls_destination() {
    let certs = Certs::new("plain-src");
    let (addr, dest) = tls_destination(&certs);
    let err = migrate_with(&TcpDialer(addr)).unwrap_err();
    assert!(
        err.contains("destination refused the stream")
            && err.contains("requires it: start the source with --tls-dir"),
        "{err}"
    );
    let d = dest_error(dest);
    assert!(d.contains("the source connected without TLS"), "{d}");
}

#[test]
fn a_tls_source_is_refused_by_a_plaintext_destination() {
    let certs = Certs::new("plain-dst");
    let (addr, dest) = plain_destination();
    let err = migrate_with(&certs.config().dialer(&addr).unwrap()).unwrap_err();
    assert!(
        err.contains("answered without TLS") && err.contains("started without --tls-dir"),
        "{err}"
    );
    let d = dest_error(dest);
    assert!(d.contains("the peer speaks TLS"), "{d}");
}

#[test]
fn a_source_with_a_certificate_from_another_ca_is_refused() {
    let ours = Certs::new("ca-dst");
    let theirs = Certs::new("ca-src");
    let (addr, dest) = tls_destination(&ours);
    let err = migrate_with(&theirs.config().dialer(&addr).unwrap()).unwrap_err();
    // The source checks the destination first, and refuses it for the same
    // reason.
    assert!(
        err.contains("the destination's certificate is not signed by this side's CA"),
        "{err}"
    );
    let d = dest_error(dest);
    assert!(d.contains("TLS with"), "{d}");
}

#[test]
fn a_destination_refuses_a_client_certificate_from_another_ca() {
    // A source that trusts the destination's CA but holds a certificate of
    // another: only the destination's check can stop it.
    let ours = Certs::new("cc-dst");
    let theirs = Certs::new("cc-src");
    let mixed = mixed_dir(&ours.0, &theirs.0);
    let (addr, dest) = tls_destination(&ours);
    let config = TlsConfig::load(&mixed.0).unwrap();
    let err = migrate_with(&config.dialer(&addr).unwrap()).unwrap_err();
    assert!(
        err.contains("the destination refused this side's certificate"),
        "{err}"
    );
    let d = dest_error(dest);
    assert!(
        d.contains("the source's certificate is not signed by this side's CA"),
        "{d}"
    );
}

#[test]
fn a_source_without_a_certificate_is_refused_before_any_data() {
    let certs = Certs::new("nocert");
    let (addr, dest) = tls_destination(&certs);
    // A client that trusts the CA but presents no certificate.
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(certs.0.join(CA_FILE)).unwrap();
    use rustls::pki_types::pem::PemObject;
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = std::net::TcpStream::connect(&addr).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    // The client's handshake may complete; whatever it then sends, the
    // destination never reads it as a migration.
    use std::io::{Read, Write};
    let _ = tls.write_all(b"FERRYMIG-not-read");
    let mut buf = [0u8; 64];
    let got = tls.read(&mut buf);
    assert!(
        !matches!(got, Ok(n) if n > 0),
        "the destination answered a client without a certificate"
    );
    let d = dest_error(dest);
    assert!(d.contains("the source presented no certificate"), "{d}");
}

/// A directory with `dst`'s CA but `src`'s certificate and key.
fn mixed_dir(dst: &Path, src: &Path) -> Certs {
    let dir = std::env::temp_dir().join(format!("ferry-tls-test-mixed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(dst.join(CA_FILE), dir.join(CA_FILE)).unwrap();
    std::fs::copy(src.join(CERT_FILE), dir.join(CERT_FILE)).unwrap();
    std::fs::copy(src.join("key.pem"), dir.join("key.pem")).unwrap();
    Certs(dir)
}

#[test]
fn unusable_material_is_refused_with_the_file_named() {
    let certs = Certs::new("bad");
    std::fs::write(certs.0.join(CERT_FILE), "not a certificate\n").unwrap();
    let err = ferry_vm::error_chain(&TlsConfig::load(&certs.0).unwrap_err());
    assert!(err.contains("cert.pem holds no certificate"), "{err}");
    let missing =
        ferry_vm::error_chain(&TlsConfig::load(Path::new("/nonexistent-ferry-tls")).unwrap_err());
    assert!(
        missing.contains("cannot read /nonexistent-ferry-tls/ca.pem"),
        "{missing}"
    );
    // Existing files are never overwritten.
    let again = pki::write_throwaway(&certs.0, &[]).unwrap_err().to_string();
    assert!(again.contains("already exists"), "{again}");
}
