//! Mutual TLS between Weir's services (D-21, issue 18): every gRPC server asks for a
//! client certificate signed by the cluster's CA, and every gRPC client presents its
//! own and checks the server's against the same CA. A certificate names its holder as
//! `spiffe://weir/ROLE/ID` (`weir certs issue`); servers read the caller's role and id
//! from it ([`crate::peer`]) and never from a request's body.
//!
//! A process has one identity, so the configuration is installed once at startup and
//! every channel [`crate::grpc::channel`] makes uses it. Without the flags, the cluster's
//! gRPC is plaintext, as before.

use crate::config::ConfigError;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// The cluster's CA and this process's certificate.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ClusterTlsArgs {
    /// PEM certificate of the cluster's CA (`weir certs ca`): gRPC peers must present a
    /// certificate it signed. With `--cluster-cert` and `--cluster-key`, turns on mTLS
    /// for all gRPC this process serves and calls (`weir` also takes it alone, with
    /// `--token`).
    #[arg(long, env = "WEIR_CLUSTER_CA")]
    pub cluster_ca: Option<PathBuf>,

    /// PEM certificate naming this process (`weir certs issue --role ROLE --id ID`).
    #[arg(long, env = "WEIR_CLUSTER_CERT", requires_all = ["cluster_ca", "cluster_key"])]
    pub cluster_cert: Option<PathBuf>,

    /// PEM private key of `--cluster-cert`.
    #[arg(long, env = "WEIR_CLUSTER_KEY", requires_all = ["cluster_ca", "cluster_cert"])]
    pub cluster_key: Option<PathBuf>,
}

/// Loaded [`ClusterTlsArgs`].
#[derive(Clone, Debug)]
pub struct ClusterTls {
    ca: Certificate,
    identity: Identity,
    /// Who this process is, from its own certificate.
    pub me: crate::peer::Identity,
}

impl ClusterTlsArgs {
    /// The configuration, when the flags name one; errors name the flag.
    pub fn load(&self) -> Result<Option<ClusterTls>, ConfigError> {
        match (&self.cluster_ca, &self.cluster_cert, &self.cluster_key) {
            (Some(ca), Some(cert), Some(key)) => ClusterTls::from_files(ca, cert, key).map(Some),
            (None, None, None) => Ok(None),
            _ => Err(ConfigError::new(
                "--cluster-ca, --cluster-cert and --cluster-key go together",
            )),
        }
    }

    /// Checks that `--cluster-cert`, if given, names this process: `role` with `id`
    /// (its own proposals would be refused otherwise).
    pub fn check_names(&self, role: crate::peer::Role, id: &str) -> Result<(), ConfigError> {
        if let Some(tls) = self.load()? {
            let want = crate::peer::Identity { role, id: id.into() };
            if tls.me != want {
                return Err(ConfigError::new(format!(
                    "--cluster-cert names {}, but this process is {want}",
                    tls.me
                )));
            }
        }
        Ok(())
    }

    /// The checks every node's flags pass (issue 18): `--cluster-cert`, if given, names
    /// `role` `id`; gRPC beyond loopback needs mTLS; admin HTTP beyond loopback is
    /// refused (it has no TLS or auth); `--insecure` lifts the last two.
    pub fn check_node(
        &self,
        role: crate::peer::Role,
        id: &str,
        listen: std::net::SocketAddr,
        http_listen: std::net::SocketAddr,
        insecure: bool,
    ) -> Result<(), ConfigError> {
        self.check_names(role, id)?;
        let no_mtls = format!(
            "{} has no mTLS (--cluster-ca, --cluster-cert, --cluster-key): anyone who reaches it could call its gRPC services",
            role.as_str()
        );
        let missing = self.cluster_cert.is_none().then_some(no_mtls.as_str());
        crate::config::refuse_exposed("--listen", listen, missing, insecure)?;
        crate::config::refuse_exposed(
            "--http-listen",
            http_listen,
            Some("admin HTTP (/admin, /metrics) has no TLS or auth"),
            insecure,
        )
    }

    /// Loads and installs the configuration for this process's gRPC.
    pub fn install(&self) -> Result<Option<&'static ClusterTls>, ConfigError> {
        match self.load()? {
            Some(tls) => Ok(Some(install(tls))),
            None => Ok(None),
        }
    }
}

impl ClusterTls {
    pub fn from_files(ca: &Path, cert: &Path, key: &Path) -> Result<Self, ConfigError> {
        let read = |flag: &str, p: &Path| {
            std::fs::read(p).map_err(|e| ConfigError::new(format!("{flag} {}: {e}", p.display())))
        };
        let (ca_pem, cert_pem, key_pem) = (
            read("--cluster-ca", ca)?,
            read("--cluster-cert", cert)?,
            read("--cluster-key", key)?,
        );
        // The certificate must name a Weir role and id, and the key must be its own:
        // both checked now rather than at the first handshake.
        let me = crate::peer::identity_of_pem(&cert_pem)
            .map_err(|why| ConfigError::new(format!("--cluster-cert {}: {why}", cert.display())))?;
        crate::tls::ServerTls::from_pem_files(cert, key, &[])
            .map_err(|e| ConfigError::new(format!("--cluster-cert and --cluster-key: {}", e.message)))?;
        Ok(ClusterTls {
            ca: Certificate::from_pem(ca_pem),
            identity: Identity::from_pem(cert_pem, key_pem),
            me,
        })
    }

    /// What a gRPC client of this process presents and trusts.
    pub fn client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(self.ca.clone())
            .identity(self.identity.clone())
    }

    /// What a gRPC server of this process presents and asks of callers; a handshake
    /// must finish within `handshake` (the listener's header-read timeout). With
    /// `certless_callers`, a caller may connect without a certificate, and the server
    /// must then authenticate each of its calls another way (metad's admin tokens).
    pub fn server(&self, handshake: Duration, certless_callers: bool) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(self.identity.clone())
            .client_ca_root(self.ca.clone())
            .client_auth_optional(certless_callers)
            .timeout(handshake)
    }
}

/// What a client without a certificate of its own trusts: the cluster's CA, read from
/// `--cluster-ca` (`weir --token`).
pub fn trust_only(ca: &Path) -> Result<ClientTlsConfig, ConfigError> {
    let pem = std::fs::read(ca).map_err(|e| ConfigError::new(format!("--cluster-ca {}: {e}", ca.display())))?;
    Ok(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
}

static INSTALLED: OnceLock<ClusterTls> = OnceLock::new();

/// Installs `tls` for this process; the first installation wins (one identity per
/// process), and is what is returned.
pub fn install(tls: ClusterTls) -> &'static ClusterTls {
    INSTALLED.get_or_init(|| tls)
}

/// This process's cluster TLS, if installed.
pub fn installed() -> Option<&'static ClusterTls> {
    INSTALLED.get()
}
