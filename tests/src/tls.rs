//! Certificates for tests of TLS listeners, made by the `weir certs` command a user
//! runs, and client configs that trust their CA only.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::CertificateDer;

/// A CA and one gateway's certificate signed by it.
pub struct Certs {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Certs {
    /// `weir certs ca` and `weir certs issue` for gateway `id` at `localhost` and
    /// 127.0.0.1, in `dir`.
    pub fn make(dir: &Path, id: &str) -> Certs {
        weir(&["certs", "ca", "--dir", &dir.display().to_string()]);
        let out = weir(&[
            "certs",
            "issue",
            "--dir",
            &dir.display().to_string(),
            "--role",
            "gatewayd",
            "--id",
            id,
            "--dns",
            "localhost",
            "--ip",
            "127.0.0.1",
        ]);
        let mut lines = out.lines().map(PathBuf::from);
        let (cert, key) = (lines.next().expect("cert path"), lines.next().expect("key path"));
        Certs {
            dir: dir.into(),
            ca: dir.join("ca.pem"),
            cert,
            key,
        }
    }

    /// The gateway flags serving this certificate.
    pub fn flags(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.cert.display().to_string(),
            "--tls-key".into(),
            self.key.display().to_string(),
        ]
    }
}

/// A CA for a cluster's mTLS in `dir` (`weir certs ca`), and the certificates of its
/// members, each naming `localhost` and 127.0.0.1 (where tests reach every process).
pub struct ClusterCerts {
    pub dir: PathBuf,
}

impl ClusterCerts {
    pub fn make(dir: &Path) -> ClusterCerts {
        weir(&["certs", "ca", "--dir", &dir.display().to_string()]);
        ClusterCerts { dir: dir.into() }
    }

    /// The certificate and key of `role` `id`, issued on first use.
    pub fn issue(&self, role: &str, id: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (
            self.dir.join(format!("{role}-{id}.pem")),
            self.dir.join(format!("{role}-{id}.key")),
        );
        if !cert.exists() {
            weir(&[
                "certs",
                "issue",
                "--dir",
                &self.dir.display().to_string(),
                "--role",
                role,
                "--id",
                id,
                "--dns",
                "localhost",
                "--ip",
                "127.0.0.1",
            ]);
        }
        (cert, key)
    }

    /// The `--cluster-*` flags of `role` `id`.
    pub fn flags(&self, role: &str, id: &str) -> Vec<String> {
        let (cert, key) = self.issue(role, id);
        vec![
            "--cluster-ca".into(),
            self.dir.join("ca.pem").display().to_string(),
            "--cluster-cert".into(),
            cert.display().to_string(),
            "--cluster-key".into(),
            key.display().to_string(),
        ]
    }

    /// The loaded mTLS configuration of `role` `id`, for a test's own gRPC calls.
    pub fn tls(&self, role: &str, id: &str) -> weir_shared::cluster_tls::ClusterTls {
        let (cert, key) = self.issue(role, id);
        weir_shared::cluster_tls::ClusterTls::from_files(&self.dir.join("ca.pem"), &cert, &key).expect("cluster tls")
    }
}

/// Runs `weir ARGS`, which must succeed; its stdout.
pub fn weir(args: &[&str]) -> String {
    let out = Command::new(crate::bin_path("weir"))
        .args(args)
        .output()
        .expect("weir runs");
    assert!(
        out.status.success(),
        "weir {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Runs `weir ARGS` with environment `env`, which may fail; whether it succeeded, and
/// its stdout and stderr together.
pub fn weir_outcome(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(crate::bin_path("weir"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("weir runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A client config trusting only the CA at `ca`.
pub fn client_config(ca: &Path) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca).expect("CA pem"))
        .expect("CA certificate");
    let mut config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}
