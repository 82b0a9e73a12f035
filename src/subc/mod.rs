//! The subc layer: broca as a module of the CortexKit subc daemon, without an async runtime.
//!
//! - [`connection_file`]: the `--subc` connection file (owner-only, validated);
//! - [`handshake`]: the HMAC-SHA256 client handshake on a blocking socket;
//! - [`frame`]: the 21-byte envelope from `subc_protocol`, an incremental decoder, size limits;
//! - [`module`]: registration ([`connect`]) and the [`Handler`] / [`Authorizer`] seams;
//! - `io`: the io thread (one `mio::Poll` loop owning the socket);
//! - [`outbound`]: the cloneable [`Outbound`] handle other threads reply through;
//! - [`routes`]: the `(channel, epoch)` table and open requests;
//! - [`consumer`]: the second connection broca opens routes to other modules on (a bounded
//!   route cache per target and identity, a writer thread, reconnect on loss).
//!
//! This layer knows frames, routes and requests, never what an operation means. The wire facts
//! it relies on are in `reference/subc-wire.md`.

pub mod connection_file;
pub mod consumer;
pub mod frame;
pub mod handler;
pub mod handshake;
mod io;
#[cfg(test)]
mod io_tests;
pub mod module;
pub mod outbound;
pub mod routes;
pub mod sigterm;

pub use io::CLOSE_DRAIN;
pub use module::{
    connect, health_ok, Authorizer, BindRequest, ConnectError, ConnectionEnd, ControlReply, ControlRequest, Handler,
    ModuleConn, Running,
};
pub use outbound::{Outbound, SendError};
pub use routes::Route;
