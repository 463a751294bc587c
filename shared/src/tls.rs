//! TLS on client-facing listeners (issue 18): the gateway's HTTP API (HTTPS) and Kafka
//! listener (`SSL`, `SASL_SSL`). One certificate and key, PEM files, serve both. rustls
//! with the aws-lc-rs provider, named explicitly so a build that also links `ring`
//! cannot make the choice ambiguous.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::config::ConfigError;

/// A listener's certificate, from its flags.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ServerTlsArgs {
    /// PEM certificate chain (leaf first) served on the HTTP API (HTTPS) and the Kafka
    /// listener (`SSL`, or `SASL_SSL` with `--auth`); `weir certs issue` makes one.
    /// Without it both listeners are plaintext.
    #[arg(long, env = "WEIR_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of `--tls-cert`.
    #[arg(long, env = "WEIR_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// How a listener's connections start: in clear, or with a TLS handshake.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: TlsAcceptor,
}

impl ServerTlsArgs {
    /// The listener's TLS, when its flags name a certificate; errors name the flag.
    pub fn load(&self, alpn: &[&[u8]]) -> Result<Option<ServerTls>, ConfigError> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => ServerTls::from_pem_files(cert, key, alpn).map(Some),
            (None, None) => Ok(None),
            _ => Err(ConfigError::new("--tls-cert and --tls-key go together")),
        }
    }
}

/// The crypto provider every TLS config in Weir uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

impl ServerTls {
    /// `alpn` lists the application protocols offered, most preferred first (`h2`,
    /// `http/1.1` for HTTP; none for Kafka, which has no ALPN name).
    pub fn from_pem_files(cert: &Path, key: &Path, alpn: &[&[u8]]) -> Result<Self, ConfigError> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<_, _>>())
            .map_err(|e| ConfigError::new(format!("--tls-cert {}: {e}", cert.display())))?;
        if chain.is_empty() {
            return Err(ConfigError::new(format!(
                "--tls-cert {}: no PEM certificate in it",
                cert.display()
            )));
        }
        let key = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| ConfigError::new(format!("--tls-key {}: {e}", key.display())))?;
        Self::new(chain, key, alpn).map_err(|e| ConfigError::new(format!("--tls-cert and --tls-key: {e}")))
    }

    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        alpn: &[&[u8]],
    ) -> Result<Self, rustls::Error> {
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            // Checks that the key belongs to the certificate.
            .with_single_cert(chain, key)?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(ServerTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }
}

/// Starts a connection: as is without TLS, after the handshake with it. The handshake
/// must finish within `within` (the listener's header-read timeout), so a peer that
/// connects and sends nothing, or plaintext to a TLS port, holds its slot no longer.
pub async fn start<S>(tls: Option<&ServerTls>, io: S, within: Duration, listener: &str) -> io::Result<MaybeTls<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let Some(tls) = tls else {
        return Ok(MaybeTls::Plain(io));
    };
    match tokio::time::timeout(within, tls.acceptor.accept(io)).await {
        Ok(Ok(stream)) => Ok(MaybeTls::Tls(Box::new(stream))),
        Ok(Err(e)) => {
            crate::listener::count_closed(listener, "tls_handshake");
            Err(e)
        }
        Err(_) => {
            crate::listener::count_closed(listener, "header_read_timeout");
            Err(io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))
        }
    }
}

/// A connection in clear or under TLS.
pub enum MaybeTls<S> {
    Plain(S),
    Tls(Box<TlsStream<S>>),
}

impl<S> MaybeTls<S> {
    pub fn is_tls(&self) -> bool {
        matches!(self, MaybeTls::Tls(_))
    }

    /// The protocol the client chose by ALPN, if any.
    pub fn alpn(&self) -> Option<&[u8]> {
        match self {
            MaybeTls::Plain(_) => None,
            MaybeTls::Tls(t) => t.get_ref().1.alpn_protocol(),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for MaybeTls<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for MaybeTls<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(s) => s.is_write_vectored(),
            MaybeTls::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_flush(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::pki_types::ServerName;

    fn self_signed() -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (
            cert.der().clone(),
            PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
    }

    #[tokio::test]
    async fn a_tls_client_and_a_plaintext_client_each_get_what_the_listener_speaks() {
        let (cert, key) = self_signed();
        let tls = ServerTls::new(vec![cert.clone()], key, &[]).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));

        // Over TLS, bytes go both ways.
        let (a, b) = tokio::io::duplex(1 << 16);
        let tasks = tokio_util::task::TaskTracker::new();
        let server = tasks.spawn({
            let tls = tls.clone();
            async move {
                let mut s = start(Some(&tls), b, Duration::from_secs(5), "test").await.unwrap();
                assert!(s.is_tls());
                let mut buf = [0u8; 5];
                s.read_exact(&mut buf).await.unwrap();
                s.write_all(&buf).await.unwrap();
                s.flush().await.unwrap();
            }
        });
        let mut c = connector
            .connect(ServerName::try_from("localhost").unwrap(), a)
            .await
            .unwrap();
        c.write_all(b"hello").await.unwrap();
        let mut echo = [0u8; 5];
        c.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"hello");
        server.await.unwrap();

        // Plaintext to a TLS listener fails its handshake; silence times out.
        let (mut a, b) = tokio::io::duplex(1 << 16);
        a.write_all(b"\0\0\0\x10plaintext kafka!").await.unwrap();
        assert!(start(Some(&tls), b, Duration::from_secs(5), "test").await.is_err());
        let (_a, b) = tokio::io::duplex(1 << 16);
        let err = start(Some(&tls), b, Duration::from_millis(50), "test")
            .await
            .err()
            .unwrap();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused_naming_the_flags() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let other_key = rcgen::KeyPair::generate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, other_key.serialize_pem()).unwrap();
        let err = ServerTls::from_pem_files(&c, &k, &[]).err().unwrap();
        assert!(err.message.starts_with("--tls-cert and --tls-key"), "{}", err.message);
        let err = ServerTls::from_pem_files(&dir.path().join("none.pem"), &k, &[])
            .err()
            .unwrap();
        assert!(err.message.starts_with("--tls-cert "), "{}", err.message);
        std::fs::write(&k, key.serialize_pem()).unwrap();
        assert!(ServerTls::from_pem_files(&c, &k, &[]).is_ok());
    }
}
