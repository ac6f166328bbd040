//! Switchboard's core: one runtime per profile that owns identities, contacts, the protocol state
//! machines, a SQLite store with a durable outbox and audit log, relay transports, and the
//! localhost bridge that the CLI, MCP server and UI use.
//!
//! Layering (see ARCHITECTURE.md): `protocol` is sans-io; `store` and `transport` perform I/O;
//! `engine` is the one place that joins them; `api` is the request vocabulary beneath the engine
//! and its clients; `bridge` and `cli` are clients of the engine.

#[cfg(feature = "runtime")]
pub mod api;
#[cfg(feature = "runtime")]
pub mod bridge;
#[cfg(feature = "runtime")]
pub mod cli;
#[cfg(feature = "runtime")]
pub mod engine;
pub mod identity;
#[cfg(feature = "runtime")]
pub mod mls;
#[cfg(feature = "runtime")]
pub mod profile;
pub mod protocol;
#[cfg(feature = "runtime")]
pub mod store;
#[cfg(feature = "runtime")]
pub mod transport;
pub mod util;
