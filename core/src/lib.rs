//! Switchboard's core: one runtime per profile that owns identities, contacts, the protocol state
//! machines, a SQLite store with a durable outbox and audit log, relay transports, and the
//! localhost bridge that the CLI, MCP server and UI use.
//!
//! Layering (see ARCHITECTURE.md): `protocol` is sans-io; `store` and `transport` perform I/O;
//! `engine` is the one place that joins them; `bridge` and `cli` are clients of the engine.

pub mod bridge;
pub mod cli;
pub mod engine;
pub mod identity;
pub mod profile;
pub mod protocol;
pub mod store;
pub mod transport;
pub mod util;
