//! Which protocol a row belongs to: the `protocol` column of contacts, messages, the outbox, seen
//! ids and the audit log, stored as the same strings the database has always held (no migration).
//! The engine maps each variant to its channel in one match (`engine::channels::channel`).

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
}
