//! The LAN path's rows (issue 17): which path carried a message (`messages.path`, `audit.path`,
//! migration 0011), the outbox's hand-over with its path, the on/off setting (`meta.lan`), and
//! relays trusted by certificate pin (`trusted_relays`, migration 0016).

use sqlx::SqliteConnection;

use super::{Audit, OutboxRow, Protocol, Result, Stmt, Store, StoreError, audit_via};

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
    set_message_path_stmt(direction, protocol, peer, id, path).execute(conn).await?;
    Ok(())
}

/// [`set_message_path`] as a statement to queue or run.
pub fn set_message_path_stmt(direction: &str, protocol: Protocol, peer: &str, id: &str, path: DeliveryPath) -> Stmt {
    Stmt::new("UPDATE messages SET path = ? WHERE direction = ? AND protocol = ? AND peer = ? AND id = ?")
        .bind(path.as_str())
        .bind(direction)
        .bind(protocol.as_str())
        .bind(peer)
        .bind(id)
}

impl Store {
    /// A relay took the payload (`DeliveryPath::Relay`), or a nearby contact stored it (`DeliveryPath::Direct`):
    /// the outbox row goes, the message moves to `relayed` (handed over, awaiting the receipt;
    /// a receipt that came first keeps its state) with its path, and the audit row says which
    /// path. One transaction.
    pub async fn outbox_handed_over(&self, row: &OutboxRow, path: DeliveryPath, now: i64) -> Result<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query("DELETE FROM outbox WHERE id = ?").bind(row.id).execute(&mut *tx).await?;
        // The audit names the peer as the message (and its `queued` audit row) does: for Agent
        // Mail the contact's agent id, not the mailbox the packet went to.
        let peer: Option<String> =
            sqlx::query_scalar(MARK_RELAYED).bind(path.as_str()).bind(&row.message_id).fetch_optional(&mut *tx).await?;
        let audit = Audit {
            direction: "out",
            protocol: row.protocol.as_str(),
            peer: peer.as_deref().unwrap_or(&row.target),
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

/// [`Store::outbox_handed_over`]: through `messages_by_id` (0021), named: without a condition on
/// the state SQLite would walk every outgoing entry of the unique index. The path is recorded
/// whatever the state: the recipient's receipt can arrive and mark the message `delivered` before
/// the hand-over commits (a nearby contact answers in a millisecond; seen in CI's LAN test), and
/// the message was carried on this path all the same. Only a `queued` message moves to
/// `relayed`; a later state stays.
pub(crate) const MARK_RELAYED: &str = "UPDATE messages INDEXED BY messages_by_id \
     SET state = CASE state WHEN 'queued' THEN 'relayed' ELSE state END, path = ? \
     WHERE direction = 'out' AND id = ? RETURNING peer";

/// [`Store::outbox_contact`]: through `messages_by_id` (0021).
pub(crate) const OUTBOX_CONTACT: &str =
    "SELECT contact_id FROM messages WHERE direction = 'out' AND protocol = ? AND id = ? AND contact_id IS NOT NULL";

impl Store {
    /// The contact an outbox row's message goes to (`None` for rows without one).
    pub async fn outbox_contact(&self, row: &OutboxRow) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(OUTBOX_CONTACT)
            .bind(row.protocol)
            .bind(&row.message_id)
            .fetch_optional(&self.pool)
            .await?
            .flatten())
    }
}

/// Who vouched for a trusted relay's certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayVouch {
    /// A pinned contact signed a LAN announcement of it.
    Contact {
        /// The contact's row id.
        id: i64,
        /// When the announcement lapses (display only).
        expires_at: i64,
    },
    /// The owner accepted it.
    User,
}

/// A relay trusted by certificate pin, and who vouched for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedRelayRow {
    /// The relay's URL (canonical, no trailing slash).
    pub url: String,
    /// SHA-256 of the certificate's DER.
    pub cert_sha256: [u8; 32],
    /// Who vouched for it.
    pub vouch: RelayVouch,
    /// The vouching contact's name, for a contact's vouch.
    pub contact_name: Option<String>,
    /// When it was last vouched for.
    pub updated_at: i64,
}

/// A row the schema's checks should have kept out (a bug, or a hand-edited database).
fn corrupt(what: String) -> StoreError {
    StoreError::Sql(sqlx::Error::Decode(what.into()))
}

type TrustedRelayTuple = (String, Vec<u8>, String, Option<i64>, i64, i64, Option<String>);

fn trusted_relay_row(t: TrustedRelayTuple) -> Result<TrustedRelayRow> {
    let (url, cert, source, contact_id, expires_at, updated_at, contact_name) = t;
    let cert_sha256 = <[u8; 32]>::try_from(cert.as_slice())
        .map_err(|_| corrupt(format!("trusted relay {url}: certificate pin is not 32 bytes")))?;
    let vouch = match (source.as_str(), contact_id) {
        ("contact", Some(id)) => RelayVouch::Contact { id, expires_at },
        ("user", None) => RelayVouch::User,
        _ => return Err(corrupt(format!("trusted relay {url}: source {source} with contact {contact_id:?}"))),
    };
    Ok(TrustedRelayRow { url, cert_sha256, vouch, contact_name, updated_at })
}

/// Records (or replaces) the pin of the relay at `url`, vouched for by `vouch`, inside a
/// transaction.
pub async fn trust_relay(
    conn: &mut SqliteConnection,
    url: &str,
    cert_sha256: &[u8; 32],
    vouch: &RelayVouch,
    now: i64,
) -> Result<()> {
    let (source, contact, expires) = match vouch {
        RelayVouch::Contact { id, expires_at } => ("contact", Some(*id), *expires_at),
        RelayVouch::User => ("user", None, 0),
    };
    sqlx::query(
        "INSERT INTO trusted_relays (url, cert_sha256, source, contact_id, expires_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (url) DO UPDATE SET cert_sha256 = excluded.cert_sha256, \
         source = excluded.source, contact_id = excluded.contact_id, expires_at = excluded.expires_at, \
         updated_at = excluded.updated_at",
    )
    .bind(url)
    .bind(cert_sha256.as_slice())
    .bind(source)
    .bind(contact)
    .bind(expires)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

/// The trusted pin for the relay at `url`, if any, inside a transaction.
pub async fn trusted_relay(conn: &mut SqliteConnection, url: &str) -> Result<Option<TrustedRelayRow>> {
    let row: Option<TrustedRelayTuple> = sqlx::query_as(
        "SELECT t.url, t.cert_sha256, t.source, t.contact_id, t.expires_at, t.updated_at, c.name FROM trusted_relays t \
         LEFT JOIN contacts c ON c.id = t.contact_id WHERE t.url = ?",
    )
    .bind(url)
    .fetch_optional(conn)
    .await?;
    row.map(trusted_relay_row).transpose()
}

impl Store {
    /// Records (or replaces) the pin of the relay at `url`, vouched for by `vouch`.
    pub async fn trust_relay(&self, url: &str, cert_sha256: &[u8; 32], vouch: &RelayVouch, now: i64) -> Result<()> {
        trust_relay(&mut *self.pool.acquire().await?, url, cert_sha256, vouch, now).await
    }

    /// The trusted pin for the relay at `url`, if any.
    pub async fn trusted_relay(&self, url: &str) -> Result<Option<TrustedRelayRow>> {
        trusted_relay(&mut *self.pool.acquire().await?, url).await
    }

    /// Every trusted relay, by URL.
    pub async fn trusted_relays(&self) -> Result<Vec<TrustedRelayRow>> {
        let rows: Vec<TrustedRelayTuple> =
            sqlx::query_as(
            "SELECT t.url, t.cert_sha256, t.source, t.contact_id, t.expires_at, t.updated_at, c.name FROM trusted_relays t LEFT JOIN contacts c ON c.id = t.contact_id ORDER BY t.url",
        ).fetch_all(&self.pool).await?;
        rows.into_iter().map(trusted_relay_row).collect()
    }

    /// Forgets the pin of the relay at `url`; whether there was one.
    pub async fn untrust_relay(&self, url: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM trusted_relays WHERE url = ?").bind(url).execute(&self.pool).await?;
        Ok(done.rows_affected() > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NewContact, insert_contact};

    async fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        (dir, store)
    }

    async fn contact(store: &Store, name: &str) -> i64 {
        let mut conn = store.pool.acquire().await.unwrap();
        let c = NewContact {
            name,
            protocol: Protocol::Letagents,
            peer_id: name,
            address: name,
            sig_pub: &[1; 32],
            box_pub: &[2; 32],
            drop_code: None,
            relay_url: None,
            state: crate::store::ContactState::Active,
            allow_kinds: "",
            request_body: "",
            now: 0,
        };
        insert_contact(&mut conn, &c).await.unwrap()
    }

    const URL: &str = "https://198.18.0.1:8443";

    #[tokio::test]
    async fn a_later_vouch_replaces_the_pin_and_says_who_vouched() {
        let (_d, store) = store().await;
        let alice = contact(&store, "alice").await;
        assert_eq!(store.trusted_relay(URL).await.unwrap(), None);
        store.trust_relay(URL, &[7; 32], &RelayVouch::Contact { id: alice, expires_at: 99 }, 1).await.unwrap();
        let row = store.trusted_relay(URL).await.unwrap().unwrap();
        assert_eq!(
            (row.cert_sha256, row.vouch, row.contact_name.as_deref()),
            ([7; 32], RelayVouch::Contact { id: alice, expires_at: 99 }, Some("alice"))
        );
        // The owner accepts a new certificate for the same URL: one row, now theirs.
        store.trust_relay(URL, &[8; 32], &RelayVouch::User, 2).await.unwrap();
        let all = store.trusted_relays().await.unwrap();
        assert_eq!(all.len(), 1);
        let row = all.first().unwrap();
        assert_eq!(
            (row.cert_sha256, &row.vouch, row.contact_name.as_deref(), row.updated_at),
            ([8; 32], &RelayVouch::User, None, 2)
        );
        assert!(store.untrust_relay(URL).await.unwrap());
        assert!(!store.untrust_relay(URL).await.unwrap());
        assert!(store.trusted_relays().await.unwrap().is_empty());
    }

    /// An outgoing message to `bob`, queued, and its outbox row.
    async fn queued_to(store: &Store, bob: i64, id: &str) -> OutboxRow {
        let mut conn = store.pool.acquire().await.unwrap();
        let m = crate::store::NewMessage {
            id,
            direction: "out",
            protocol: Protocol::Letagents,
            contact_id: Some(bob),
            peer: "bob",
            kind: "text",
            body: "hi",
            reply_to: None,
            from_agent: None,
            to_agent: None,
            ts: 1,
            state: "queued",
            hidden: false,
            now: 1,
        };
        crate::store::insert_message(&mut conn, &m).await.unwrap();
        let q = crate::store::Queued {
            message_id: id,
            protocol: Protocol::Letagents,
            kind: "text",
            relay_url: URL,
            target: "bob-mailbox",
            peer: "bob",
            drop_code: b"",
            payload: b"sealed",
        };
        crate::store::enqueue(&mut conn, q, 1).await.unwrap();
        drop(conn);
        let rows = store.due_outbox(i64::MAX, 10).unwrap();
        rows.into_iter().find(|r| r.message_id == id).unwrap()
    }

    #[tokio::test]
    async fn the_path_is_kept_when_the_receipt_overtakes_the_hand_over() {
        let (_d, store) = store().await;
        let bob = contact(&store, "bob").await;
        // The usual order: handed over directly, then the receipt.
        let row = queued_to(&store, bob, "m1").await;
        store.outbox_handed_over(&row, DeliveryPath::Direct, 2).await.unwrap();
        let m = store.message("out", "m1").unwrap().unwrap();
        assert_eq!((m.state.as_str(), m.path.as_str()), ("relayed", "direct"));
        // A nearby contact's receipt can be processed before the hand-over commits (seen in the
        // LAN test): the message is `delivered` already, keeps that state and still gets its path.
        let row = queued_to(&store, bob, "m2").await;
        let mut conn = store.pool.acquire().await.unwrap();
        assert!(crate::store::set_outgoing_state(&mut conn, "m2", "bob", "delivered", "").await.unwrap());
        drop(conn);
        store.outbox_handed_over(&row, DeliveryPath::Direct, 2).await.unwrap();
        let m = store.message("out", "m2").unwrap().unwrap();
        assert_eq!((m.state.as_str(), m.path.as_str()), ("delivered", "direct"));
        assert_eq!(store.outbox_len().await.unwrap(), 0);
        // The audit row names the message's peer (not the outbox row's target) either way.
        let relayed: Vec<(String, String)> = (store.audit_log(Some("m2"), 100).await.unwrap().into_iter())
            .filter(|r| r.state == "relayed")
            .map(|r| (r.peer, r.path))
            .collect();
        assert_eq!(relayed, [("bob".to_owned(), "direct".to_owned())]);
    }

    #[tokio::test]
    async fn a_relay_a_contact_vouched_for_goes_with_the_contact() {
        let (_d, store) = store().await;
        let alice = contact(&store, "alice").await;
        store.trust_relay(URL, &[7; 32], &RelayVouch::Contact { id: alice, expires_at: 0 }, 1).await.unwrap();
        store.trust_relay("https://198.18.0.9", &[9; 32], &RelayVouch::User, 1).await.unwrap();
        store.delete_contact(alice).await.unwrap();
        let urls: Vec<String> = store.trusted_relays().await.unwrap().into_iter().map(|r| r.url).collect();
        assert_eq!(urls, vec!["https://198.18.0.9".to_owned()]);
    }
}
