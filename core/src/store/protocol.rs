//! Column values as types, stored as the same strings the database has always held (no
//! migration):
//! - [`Protocol`]: which protocol a row belongs to (the `protocol` column of contacts, messages,
//!   the outbox, seen ids and the audit log). The engine maps each variant to its channel in one
//!   match (`engine::channels::channel`).
//! - [`ContactState`]: whether a contact is one the owner has (`active`) or a request waiting for
//!   the owner's decision (`pending`).

use std::fmt;

/// A 1:1 messaging protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, sqlx::Type)]
pub enum Protocol {
    /// letagents v1.
    #[sqlx(rename = "letagents")]
    Letagents,
    /// Stringcup v2.
    #[sqlx(rename = "stringcup")]
    Stringcup,
    /// Agent Mail 1.0.
    #[sqlx(rename = "agent-mail")]
    AgentMail,
}

impl Protocol {
    /// Every protocol, in the order the runtime syncs them.
    pub const ALL: [Protocol; 3] = [Protocol::Letagents, Protocol::Stringcup, Protocol::AgentMail];

    /// The stored (and client-visible) name.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Letagents => "letagents",
            Protocol::Stringcup => "stringcup",
            Protocol::AgentMail => "agent-mail",
        }
    }

    /// The protocol of a stored name.
    pub fn parse(s: &str) -> Option<Protocol> {
        Protocol::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Protocol {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Whether the owner has accepted a contact (`contacts.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, sqlx::Type, serde::Serialize)]
#[sqlx(rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum ContactState {
    /// A contact: messages go both ways.
    Active,
    /// A request (a peer introduced itself): held until the owner accepts or denies it.
    Pending,
}

impl ContactState {
    /// The stored (and client-visible) name.
    pub fn as_str(self) -> &'static str {
        match self {
            ContactState::Active => "active",
            ContactState::Pending => "pending",
        }
    }
}

impl fmt::Display for ContactState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn protocols_are_stored_as_the_strings_the_database_already_holds() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        for (p, s) in [
            (Protocol::Letagents, "letagents"),
            (Protocol::Stringcup, "stringcup"),
            (Protocol::AgentMail, "agent-mail"),
        ] {
            let stored: String = sqlx::query_scalar("SELECT ?").bind(p).fetch_one(&pool).await.unwrap();
            assert_eq!(stored, s);
            let read: Protocol = sqlx::query_scalar("SELECT ?").bind(s).fetch_one(&pool).await.unwrap();
            assert_eq!(read, p);
            assert_eq!(Protocol::parse(s), Some(p));
            assert_eq!(serde_json::to_value(p).unwrap(), s);
        }
        assert!(sqlx::query_scalar::<_, Protocol>("SELECT 'letmeknow'").fetch_one(&pool).await.is_err());
    }

    #[tokio::test]
    async fn contact_states_are_stored_as_the_strings_the_check_constraint_allows() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        for (state, s) in [(ContactState::Active, "active"), (ContactState::Pending, "pending")] {
            let stored: String = sqlx::query_scalar("SELECT ?").bind(state).fetch_one(&pool).await.unwrap();
            assert_eq!(stored, s);
            let read: ContactState = sqlx::query_scalar("SELECT ?").bind(s).fetch_one(&pool).await.unwrap();
            assert_eq!(read, state);
            assert_eq!(serde_json::to_value(state).unwrap(), s);
        }
        assert!(sqlx::query_scalar::<_, ContactState>("SELECT 'denied'").fetch_one(&pool).await.is_err());
    }
}
