//! `weir certs`: a cluster's own certificate authority and the certificates it signs
//! (issue 18). Keys are ECDSA P-256, written with mode 0600; nothing here leaves the
//! directory it is given.

use anyhow::{bail, Context};
use clap::Subcommand;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use time::{Duration, OffsetDateTime};
use weir_shared::peer::Role;

#[derive(Subcommand)]
pub enum CertsCmd {
    /// Make a certificate authority in DIR (`ca.pem`, and `ca.key`, which signs every
    /// other certificate: keep it off the nodes). Refuses to replace one.
    Ca {
        #[arg(long, default_value = "./weir-certs")]
        dir: PathBuf,
        /// Days the CA is valid.
        #[arg(long, default_value_t = 3650)]
        days: u32,
    },
    /// Sign a certificate for one node with DIR's CA: `ROLE-ID.pem` and `ROLE-ID.key`.
    /// Its names are the `--dns` and `--ip` given and `spiffe://weir/ROLE/ID`, the node's
    /// identity; it serves as a server's and as a client's certificate.
    Issue {
        #[arg(long, default_value = "./weir-certs")]
        dir: PathBuf,
        #[arg(long, value_enum)]
        role: Role,
        /// The node id (`--id` of metad, streamd or gatewayd; a name for an operator).
        #[arg(long)]
        id: String,
        /// A DNS name clients reach the node at; repeat for more.
        #[arg(long)]
        dns: Vec<String>,
        /// An IP address clients reach the node at; repeat for more.
        #[arg(long)]
        ip: Vec<IpAddr>,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = 365)]
        days: u32,
    },
}

pub fn run(cmd: CertsCmd) -> anyhow::Result<()> {
    match cmd {
        CertsCmd::Ca { dir, days } => {
            let cert = new_ca(&dir, days)?;
            println!("{}", cert.display());
        }
        CertsCmd::Issue {
            dir,
            role,
            id,
            dns,
            ip,
            days,
        } => {
            let (cert, key) = issue(&dir, role, &id, &dns, &ip, days)?;
            println!("{}\n{}", cert.display(), key.display());
        }
    }
    Ok(())
}

/// Where a CA's certificate is in `dir`.
pub fn ca_cert_path(dir: &Path) -> PathBuf {
    dir.join("ca.pem")
}

/// Makes a CA in `dir`; its certificate's path.
pub fn new_ca(dir: &Path, days: u32) -> anyhow::Result<PathBuf> {
    let (cert_path, key_path) = (ca_cert_path(dir), dir.join("ca.key"));
    if cert_path.exists() || key_path.exists() {
        bail!("{} already holds a CA; remove it first to make another", dir.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("--dir {}", dir.display()))?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, "Weir cluster CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, days);
    let cert = params.self_signed(&key)?;
    write_private(&key_path, &key.serialize_pem())?;
    std::fs::write(&cert_path, cert.pem()).with_context(|| cert_path.display().to_string())?;
    Ok(cert_path)
}

/// Signs a node's certificate with `dir`'s CA; the certificate's and key's paths.
pub fn issue(
    dir: &Path,
    role: Role,
    id: &str,
    dns: &[String],
    ips: &[IpAddr],
    days: u32,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        bail!("--id '{id}' must be letters, digits, '-', '_' or '.'");
    }
    let ca = load_ca(dir)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(dns.to_vec()).context("--dns")?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{}/{id}", role.as_str()));
    params
        .subject_alt_names
        .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    params
        .subject_alt_names
        .push(SanType::URI(weir_shared::peer::uri(role, id).try_into()?));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, days);
    let cert = params.signed_by(&key, &ca)?;
    let stem = format!("{}-{id}", role.as_str());
    let (cert_path, key_path) = (dir.join(format!("{stem}.pem")), dir.join(format!("{stem}.key")));
    write_private(&key_path, &key.serialize_pem())?;
    std::fs::write(&cert_path, cert.pem()).with_context(|| cert_path.display().to_string())?;
    Ok((cert_path, key_path))
}

fn load_ca(dir: &Path) -> anyhow::Result<Issuer<'static, KeyPair>> {
    let (cert_path, key_path) = (ca_cert_path(dir), dir.join("ca.key"));
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .with_context(|| format!("{}: no CA here (make one with `weir certs ca --dir`)", p.display()))
    };
    let key = KeyPair::from_pem(&read(&key_path)?).with_context(|| key_path.display().to_string())?;
    Issuer::from_ca_cert_pem(&read(&cert_path)?, key).with_context(|| cert_path.display().to_string())
}

/// Valid from an hour ago (clocks differ a little) for `days`.
fn validity(params: &mut CertificateParams, days: u32) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(i64::from(days));
}

/// Writes a private key readable by its owner only.
fn write_private(path: &Path, pem: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| path.display().to_string())?;
    f.write_all(pem.as_bytes())?;
    f.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};

    #[test]
    fn an_issued_certificate_verifies_against_its_ca_for_its_names_only() {
        let dir = tempfile::tempdir().unwrap();
        let ca = new_ca(dir.path(), 10).unwrap();
        assert!(new_ca(dir.path(), 10).is_err(), "a CA is never replaced");
        let (cert, key) = issue(
            dir.path(),
            Role::Gatewayd,
            "gw-1",
            &["gw.example".into()],
            &["127.0.0.1".parse().unwrap()],
            30,
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);

        let mut roots = tokio_rustls::rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_file(&ca).unwrap()).unwrap();
        let verifier = tokio_rustls::rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            weir_shared::tls::provider(),
        )
        .build()
        .unwrap();
        let leaf = CertificateDer::from_pem_file(&cert).unwrap();
        let verify = |name: &str| {
            verifier.verify_server_cert(
                &leaf,
                &[],
                &ServerName::try_from(name.to_string()).unwrap(),
                &[],
                UnixTime::now(),
            )
        };
        use tokio_rustls::rustls::client::danger::ServerCertVerifier;
        assert!(verify("gw.example").is_ok());
        assert!(verify("127.0.0.1").is_ok());
        assert!(verify("other.example").is_err());
        // The key is the certificate's, so a server can load the pair.
        weir_shared::tls::ServerTls::from_pem_files(&cert, &key, &[]).unwrap();
        let text = std::fs::read_to_string(&cert).unwrap();
        assert!(text.starts_with("-----BEGIN CERTIFICATE-----"));
    }

    #[test]
    fn issuing_without_a_ca_or_with_a_bad_id_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let err = issue(dir.path(), Role::Streamd, "s1", &[], &[], 1).unwrap_err();
        assert!(format!("{err:#}").contains("weir certs ca --dir"), "{err:#}");
        new_ca(dir.path(), 1).unwrap();
        let err = issue(dir.path(), Role::Streamd, "../x", &[], &[], 1).unwrap_err();
        assert!(err.to_string().starts_with("--id '../x'"), "{err}");
    }
}
