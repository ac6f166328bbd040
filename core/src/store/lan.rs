//! The LAN path's rows (issue 17): which path carried a message (`messages.path`, `audit.path`,
//! migration 0011), the outbox's hand-over with its path, and the on/off setting (`meta.lan`).

use sqlx::SqliteConnection;

use super::{Audit, OutboxRow, Protocol, Result, Store, audit_via};

/// The path that carried a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryPath {
    /// Directly to (or from) a nearby contact over the LAN layer.
    Direct,
    /// Through a relay.
    Relay,
}

impl DeliveryPath {
    /// The stored (and client-visible) name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryPath::Direct => "direct",
            DeliveryPath::Relay => "relay",
        }
    }
}

/// Records the path of a stored message (`direction` in | out) inside the caller's transaction.
pub async fn set_message_path(
    conn: &mut SqliteConnection,
    direction: &str,
    protocol: Protocol,
    peer: &str,
    id: &str,
    path: DeliveryPath,
) -> Result<()> {
    sqlx::query("UPDATE messages SET path = ? WHERE direction = ? AND protocol = ? AND peer = ? AND id = ?")
        .bind(path.as_str())
        .bind(direction)
        .bind(protocol)
        .bind(peer)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

impl Store {
    /// A relay took the payload (`DeliveryPath::Relay`), or a nearby contact stored it (`DeliveryPath::Direct`):
    /// the outbox row goes, the message moves to `relayed` (handed over, awaiting the receipt)
    /// with its path, and the audit row says which path. One transaction.
    pub async fn outbox_handed_over(&self, row: &OutboxRow, path: DeliveryPath, now: i64) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM outbox WHERE id = ?").bind(row.id).execute(&mut *tx).await?;
        sqlx::query(
            "UPDATE messages SET state = 'relayed', path = ? WHERE direction = 'out' AND id = ? AND state = 'queued'",
        )
        .bind(path.as_str())
        .bind(&row.message_id)
        .execute(&mut *tx)
        .await?;
        let audit = Audit {
            direction: "out",
            protocol: row.protocol.as_str(),
            peer: &row.target,
            message_id: &row.message_id,
            kind: &row.kind,
            state: "relayed",
            detail: if path == DeliveryPath::Direct { "stored by the nearby contact" } else { "" },
        };
        audit_via(&mut tx, now, audit, Some(path)).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The LAN setting: `Some(on)` once set, `None` before (the default applies).
    pub async fn lan_setting(&self) -> Result<Option<bool>> {
        Ok(self.meta("lan").await?.map(|v| v == "on"))
    }

    /// Records the LAN setting.
    pub async fn set_lan_setting(&self, on: bool) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        super::set_meta(&mut conn, "lan", if on { "on" } else { "off" }).await
    }
}

impl Store {
    /// The contact an outbox row's message goes to (`None` for rows without one).
    pub async fn outbox_contact(&self, row: &OutboxRow) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT contact_id FROM messages WHERE direction = 'out' AND protocol = ? AND id = ? AND contact_id IS NOT NULL",
        )
        .bind(row.protocol)
        .bind(&row.message_id)
        .fetch_optional(&self.pool)
        .await?
        .flatten())
    }
}
