//! broca-mock's HTTPS side: a throwaway certificate authority and a server certificate for
//! `localhost`, `127.0.0.1` and `::1`, generated when the server starts, and the connection type
//! the server reads and writes (plain TCP or rustls over TCP).
//!
//! The CA's PEM ([`super::MockServer::ca_pem`]) is what a test client trusts, explicitly, as an
//! extra root; nothing here or in broca turns certificate verification off. The crypto provider is
//! ring, the one ureq's rustls uses.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ServerConfig, ServerConnection, StreamOwned};

/// A generated server identity: the rustls configuration and the root a client must trust.
pub(crate) struct Identity {
    pub config: Arc<ServerConfig>,
    pub ca_pem: String,
}

/// Generates a CA and a server certificate signed by it.
pub(crate) fn generate() -> Result<Identity, String> {
    let e = |what: &str, err: &dyn std::fmt::Display| format!("broca-mock TLS: {what}: {err}");
    let ca_key = KeyPair::generate().map_err(|x| e("CA key", &x))?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(|x| e("CA params", &x))?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "broca-mock test CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = ca_params.self_signed(&ca_key).map_err(|x| e("CA certificate", &x))?;
    let key = KeyPair::generate().map_err(|x| e("server key", &x))?;
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    let mut params = CertificateParams::new(names).map_err(|x| e("server params", &x))?;
    params.distinguished_name.push(DnType::CommonName, "broca-mock");
    let cert = params.signed_by(&key, &ca, &ca_key).map_err(|x| e("server certificate", &x))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|x| e("protocol versions", &x))?
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone(), ca.der().clone()], private)
        .map_err(|x| e("server config", &x))?;
    Ok(Identity { config: Arc::new(config), ca_pem: ca.pem() })
}

/// One accepted connection.
pub(crate) enum Conn {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ServerConnection, TcpStream>>),
}

/// How a TLS connection's handshake went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Handshake {
    Full,
    Resumed,
}

impl Conn {
    /// Wraps `tcp` in TLS and completes the handshake (so it is counted before any request).
    pub(crate) fn tls(config: &Arc<ServerConfig>, mut tcp: TcpStream) -> io::Result<(Conn, Handshake)> {
        let mut conn = ServerConnection::new(Arc::clone(config)).map_err(io::Error::other)?;
        while conn.is_handshaking() {
            let (read, _) = conn.complete_io(&mut tcp)?;
            if read == 0 && conn.is_handshaking() && conn.wants_read() {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed during the TLS handshake"));
            }
        }
        let kind = match conn.handshake_kind() {
            Some(rustls::HandshakeKind::Resumed) => Handshake::Resumed,
            _ => Handshake::Full,
        };
        Ok((Conn::Tls(Box::new(StreamOwned::new(conn, tcp))), kind))
    }

    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(s) => &s.sock,
        }
    }

    /// Ends the connection politely (a TLS close_notify first), as a server closing an idle
    /// or `Connection: close` connection does.
    pub(crate) fn close(&mut self) {
        if let Conn::Tls(s) = self {
            s.conn.send_close_notify();
            let _ = s.flush();
        }
        let _ = self.tcp().shutdown(Shutdown::Both);
    }

    /// Cuts the connection without a close_notify (a scripted disconnect: a truncated stream).
    pub(crate) fn cut(&self) {
        let _ = self.tcp().shutdown(Shutdown::Both);
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}
