//! Who is calling a gRPC service, from the client certificate of an mTLS connection
//! ([`crate::cluster_tls`]): a certificate names its holder as `spiffe://weir/ROLE/ID`.
//! On a plaintext cluster there is no certificate and no caller to check.

use std::fmt;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::{Request, Status};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// What a certificate's holder is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    Metad,
    Streamd,
    Gatewayd,
    /// A person or tool administering the cluster (`weir` with `--cluster-cert`).
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Metad => "metad",
            Role::Streamd => "streamd",
            Role::Gatewayd => "gatewayd",
            Role::Operator => "operator",
        }
    }

    fn parse(s: &str) -> Option<Role> {
        [Role::Metad, Role::Streamd, Role::Gatewayd, Role::Operator]
            .into_iter()
            .find(|r| r.as_str() == s)
    }
}

/// A certificate's holder: its role and id (a node's `--id`; metad's numeric id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub role: Role,
    pub id: String,
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} '{}'", self.role.as_str(), self.id)
    }
}

/// The URI a certificate names its holder with.
pub fn uri(role: Role, id: &str) -> String {
    format!("spiffe://weir/{}/{id}", role.as_str())
}

/// The identity a DER certificate names, or why it names none.
pub fn identity_of(der: &[u8]) -> Result<Identity, String> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| format!("unreadable subject alternative names: {e}"))?
        .ok_or("no subject alternative names")?;
    let mut found = san.value.general_names.iter().filter_map(|n| match n {
        GeneralName::URI(u) => u.strip_prefix("spiffe://weir/"),
        _ => None,
    });
    let path = found.next().ok_or("no spiffe://weir/ROLE/ID name")?;
    if found.next().is_some() {
        return Err("more than one spiffe://weir/ name".into());
    }
    let (role, id) = path.split_once('/').ok_or("spiffe://weir/ name is not ROLE/ID")?;
    let role = Role::parse(role).ok_or_else(|| format!("unknown role '{role}'"))?;
    if id.is_empty() || id.contains('/') {
        return Err(format!("bad id '{id}'"));
    }
    Ok(Identity { role, id: id.into() })
}

/// As [`identity_of`], for the first certificate of a PEM file's contents.
pub fn identity_of_pem(pem: &[u8]) -> Result<Identity, String> {
    let der = CertificateDer::from_pem_slice(pem).map_err(|e| format!("no PEM certificate: {e}"))?;
    identity_of(&der)
}

/// The caller of `req`: `None` on a plaintext connection (a cluster without mTLS).
/// On a TLS connection the caller is who its certificate names, or who a server's
/// interceptor authenticated otherwise and put in the request's extensions (metad's
/// admin tokens); a caller with neither, or with a certificate the CA signed that names
/// no Weir identity, is refused.
pub fn caller<T>(req: &Request<T>) -> Result<Option<Identity>, Status> {
    if let Some(who) = req.extensions().get::<Identity>() {
        return Ok(Some(who.clone()));
    }
    let Some(tls) = req.extensions().get::<TlsConnectInfo<TcpConnectInfo>>() else {
        return Ok(None);
    };
    let certs = tls.peer_certs().unwrap_or_default();
    let leaf = certs
        .first()
        .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
    identity_of(leaf)
        .map(Some)
        .map_err(|why| Status::unauthenticated(format!("client certificate: {why}")))
}

/// The caller of `req`, which must hold one of `roles` to call `what`.
pub fn require<T>(req: &Request<T>, roles: &[Role], what: &str) -> Result<Option<Identity>, Status> {
    let caller = caller(req)?;
    match &caller {
        Some(who) if !roles.contains(&who.role) => Err(Status::permission_denied(format!("{who} may not call {what}"))),
        _ => Ok(caller),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_with(uris: &[&str]) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        for u in uris {
            params
                .subject_alt_names
                .push(rcgen::SanType::URI(u.to_string().try_into().unwrap()));
        }
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn a_certificate_names_its_role_and_id_once() {
        assert_eq!(
            identity_of(&cert_with(&["spiffe://weir/streamd/s-1"])),
            Ok(Identity {
                role: Role::Streamd,
                id: "s-1".into()
            })
        );
        assert_eq!(
            identity_of(&cert_with(&[uri(Role::Metad, "2").as_str()])).unwrap().id,
            "2"
        );
        for bad in [
            &[][..],
            &["spiffe://weir/root/x"],
            &["spiffe://weir/streamd/"],
            &["spiffe://weir/streamd"],
            &["spiffe://weir/streamd/a", "spiffe://weir/gatewayd/b"],
        ] {
            assert!(identity_of(&cert_with(bad)).is_err(), "{bad:?}");
        }
    }
}
