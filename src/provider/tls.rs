//! The provider client's TLS as a ureq connector: every agent wraps its connections with the
//! one shared rustls [`ClientConfig`] the client built (its roots, ring, its in-memory session
//! cache), so a new connection to a host any agent has seen resumes the TLS session.
//!
//! ureq 2 took a `ClientConfig` on its agent builder; ureq 3's `TlsConfig` builds its own
//! configuration per agent (its own session cache, and roots that are either the webpki set
//! or a list of certificates, not both), so the client brings this connector instead. It is
//! ureq's rustls connector with the configuration given rather than built, written against
//! ureq's `unversioned` transport API (outside its semver promise: a ureq minor release may
//! change it, and then this file).

use std::io::{Read, Write};
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use ureq::unversioned::resolver::DefaultResolver;
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, Either, LazyBuffers, NextTimeout, TcpConnector, Transport, TransportAdapter,
};

/// An agent with `config` whose HTTPS connections use `tls` (plain TCP, no proxy: the client
/// never configures one).
pub(super) fn agent(config: ureq::config::Config, tls: Arc<ClientConfig>) -> ureq::Agent {
    let connector = ().chain(TcpConnector::default()).chain(SharedTls(tls));
    ureq::Agent::with_parts(config, connector, DefaultResolver::default())
}

/// Wraps an `https` connection in TLS with the shared configuration; passes anything else on.
struct SharedTls(Arc<ClientConfig>);

impl std::fmt::Debug for SharedTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedTls").finish()
    }
}

impl<In: Transport> Connector<In> for SharedTls {
    type Out = Either<In, TlsTransport>;

    fn connect(&self, details: &ConnectionDetails, chained: Option<In>) -> Result<Option<Self::Out>, ureq::Error> {
        let Some(transport) = chained else {
            return Ok(None);
        };
        if !details.needs_tls() || transport.is_tls() {
            return Ok(Some(Either::A(transport)));
        }
        let host = details.uri.host().ok_or(ureq::Error::Tls("no host to verify the certificate for"))?;
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        let name =
            ServerName::try_from(bare.to_owned()).map_err(|_| ureq::Error::Tls("not a DNS name or IP address"))?;
        let mut conn = ClientConnection::new(Arc::clone(&self.0), name)?;
        let mut sock = TransportAdapter::new(transport.boxed(), details.current_time.clone());
        sock.set_timeout(details.timeout);
        conn.complete_io(&mut sock)?;
        let buffers = LazyBuffers::new(details.config.input_buffer_size(), details.config.output_buffer_size());
        Ok(Some(Either::B(TlsTransport { buffers, stream: StreamOwned { conn, sock } })))
    }
}

/// A TLS connection over the chained transport.
pub(super) struct TlsTransport {
    buffers: LazyBuffers,
    stream: StreamOwned<ClientConnection, TransportAdapter>,
}

impl std::fmt::Debug for TlsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsTransport").field("chained", &self.stream.sock.inner()).finish()
    }
}

impl Transport for TlsTransport {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let output = &self.buffers.output()[..amount];
        self.stream.write_all(output)?;
        Ok(())
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let input = self.buffers.input_append_buf();
        let amount = self.stream.read(input)?;
        self.buffers.input_appended(amount);
        Ok(amount > 0)
    }

    fn is_open(&mut self) -> bool {
        self.stream.get_mut().get_mut().is_open()
    }

    fn is_tls(&self) -> bool {
        true
    }
}
