//! Agent Mail's tables (migrations 0003 and 0015): our own cards, the pins of others' cards, the
//! immutable messages both ways (the recipient's deduplication key and the sender's retry
//! copy), and the attachments (non-text parts) of accepted and sent messages.
//!
//! Everything here takes a connection, so the engine can join it to one transaction; the few
//! reads made outside one are `Store` methods.

use sqlx::{Row, SqliteConnection};

use super::{Protocol, Result, Store};

/// A stored card of ours: its JCS bytes and whether the relay accepted it.
#[derive(Debug, Clone)]
pub struct OwnCardRow {
    /// `JCS(card)`.
    pub card: Vec<u8>,
    /// Whether the relay has accepted it.
    pub published: bool,
}

/// What a new card of ours is stored with.
#[derive(Debug, Clone, Copy)]
pub struct NewOwnCard<'a> {
    /// The card's hash (its key).
    pub card_hash: &'a str,
    /// Its nonce.
    pub nonce: i64,
    /// Its X25519 public key, base64url.
    pub public_key: &'a str,
    /// When it expires.
    pub expires_at: i64,
    /// Until when its key opens mail.
    pub receive_until: i64,
    /// `JCS(card)`.
    pub card: &'a [u8],
}

/// A pin as stored: per `(owner, mailbox_id)` the card with the greatest nonce seen.
#[derive(Debug, Clone, Copy)]
pub struct PinRow<'a> {
    /// Owner Agent ID.
    pub owner: &'a str,
    /// Mailbox ID.
    pub mailbox_id: &'a str,
    /// Card nonce.
    pub nonce: i64,
    /// Card hash.
    pub card_hash: &'a str,
    /// Card creation time.
    pub created_at: i64,
    /// `JCS(card)`.
    pub card: &'a [u8],
}

/// An immutable message as recorded in `am_messages`.
#[derive(Debug, Clone, Copy)]
pub struct AmMessageRow<'a> {
    /// in | out.
    pub direction: &'a str,
    /// Recipient Agent ID.
    pub recipient: &'a str,
    /// Sender Agent ID.
    pub sender: &'a str,
    /// `message_id`.
    pub message_id: &'a str,
    /// `thread_id`.
    pub thread_id: &'a str,
    /// Subject ('' for none).
    pub subject: &'a str,
    /// Parent `message_id` ('' for none).
    pub in_reply_to: &'a str,
    /// `SHA3-256(JCS(message))`.
    pub content_hash: &'a str,
    /// Acceptance deadline.
    pub expires_at: i64,
    /// The mailbox it went to.
    pub mailbox_id: &'a str,
    /// `JCS(message)`.
    pub message: &'a [u8],
    /// When recorded.
    pub created_at: i64,
}

/// One stored attachment, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct AttachmentMeta {
    /// The part's index in its message.
    pub part: i64,
    /// The sender's display name as sent ('' for none); never a path.
    pub name: String,
    /// Its media type.
    pub media_type: String,
    /// Its size in bytes.
    pub size: i64,
}

/// One attachment to store.
#[derive(Debug, Clone, Copy)]
pub struct NewAttachment<'a> {
    /// The part's index in its message.
    pub part: i64,
    /// Display name ('' for none).
    pub name: &'a str,
    /// Media type.
    pub media_type: &'a str,
    /// The bytes.
    pub data: &'a [u8],
}

/// A meta value read inside `conn`'s transaction.
pub async fn meta_in(conn: &mut SqliteConnection, key: &str) -> Result<Option<String>> {
    Ok(sqlx::query_scalar("SELECT value FROM meta WHERE key = ?").bind(key).fetch_optional(conn).await?)
}

/// The pinned card (JCS) of `(owner, mailbox_id)`.
pub async fn am_pin(conn: &mut SqliteConnection, owner: &str, mailbox_id: &str) -> Result<Option<Vec<u8>>> {
    Ok(sqlx::query_scalar("SELECT card FROM am_pins WHERE owner = ? AND mailbox_id = ?")
        .bind(owner)
        .bind(mailbox_id)
        .fetch_optional(conn)
        .await?)
}

/// Stores an advanced pin (replacing the older one).
pub async fn am_set_pin(conn: &mut SqliteConnection, pin: &PinRow<'_>) -> Result<()> {
    sqlx::query(
        "INSERT INTO am_pins (owner, mailbox_id, nonce, card_hash, created_at, card) VALUES (?, ?, ?, ?, ?, ?) \
         ON CONFLICT (owner, mailbox_id) DO UPDATE SET nonce = excluded.nonce, card_hash = excluded.card_hash, \
         created_at = excluded.created_at, card = excluded.card",
    )
    .bind(pin.owner)
    .bind(pin.mailbox_id)
    .bind(pin.nonce)
    .bind(pin.card_hash)
    .bind(pin.created_at)
    .bind(pin.card)
    .execute(conn)
    .await?;
    Ok(())
}

/// Records a new card of ours.
pub async fn am_insert_own_card(conn: &mut SqliteConnection, c: &NewOwnCard<'_>, now: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO am_own_cards (card_hash, nonce, public_key, expires_at, receive_until, card, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(c.card_hash)
    .bind(c.nonce)
    .bind(c.public_key)
    .bind(c.expires_at)
    .bind(c.receive_until)
    .bind(c.card)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

/// Records `(recipient, sender, message_id)`. Returns false when it is already there (the
/// durable deduplication key).
pub async fn am_insert_message(conn: &mut SqliteConnection, m: &AmMessageRow<'_>) -> Result<bool> {
    let n = sqlx::query(
        "INSERT INTO am_messages (direction, recipient, sender, message_id, thread_id, subject, in_reply_to, \
         content_hash, expires_at, mailbox_id, message, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
         ON CONFLICT DO NOTHING",
    )
    .bind(m.direction)
    .bind(m.recipient)
    .bind(m.sender)
    .bind(m.message_id)
    .bind(m.thread_id)
    .bind(m.subject)
    .bind(m.in_reply_to)
    .bind(m.content_hash)
    .bind(m.expires_at)
    .bind(m.mailbox_id)
    .bind(m.message)
    .bind(m.created_at)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(n > 0)
}

/// [`am_sent_to`]: the whole key.
pub(crate) const AM_SENT_TO: &str =
    "SELECT message FROM am_messages WHERE direction = 'out' AND sender = ? AND recipient = ? AND message_id = ?";

/// [`Store::am_sent`]: through `am_messages_by_id` (0022), as is [`AM_SUBJECT_THREAD`] (the key
/// wants the recipient first).
pub(crate) const AM_SENT: &str =
    "SELECT recipient, message FROM am_messages WHERE direction = 'out' AND sender = ? AND message_id = ?";

/// [`Store::am_subject_thread`].
pub(crate) const AM_SUBJECT_THREAD: &str = "SELECT subject, thread_id FROM am_messages WHERE direction = ?1 \
     AND message_id = ?3 AND ((?1 = 'in' AND sender = ?2) OR (?1 = 'out' AND recipient = ?2))";

/// The message (JCS) we sent as `sender` to `recipient` with `message_id`.
pub async fn am_sent_to(
    conn: &mut SqliteConnection,
    sender: &str,
    recipient: &str,
    message_id: &str,
) -> Result<Option<Vec<u8>>> {
    Ok(sqlx::query_scalar(AM_SENT_TO).bind(sender).bind(recipient).bind(message_id).fetch_optional(conn).await?)
}

/// Points a queued outbox row at a new packet (re-encrypted under a newer card).
pub async fn am_replace_queued_packet(
    conn: &mut SqliteConnection,
    outbox_id: i64,
    payload: &[u8],
    mailbox_id: &str,
    route: &str,
) -> Result<()> {
    sqlx::query("UPDATE outbox SET payload = ?, target = ?, relay_url = ? WHERE id = ?")
        .bind(payload)
        .bind(mailbox_id)
        .bind(route)
        .bind(outbox_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// The `rowid_` of a message row.
pub async fn message_rowid(
    conn: &mut SqliteConnection,
    direction: &str,
    protocol: Protocol,
    peer: &str,
    id: &str,
) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar("SELECT rowid_ FROM messages WHERE direction = ? AND protocol = ? AND peer = ? AND id = ?")
        .bind(direction)
        .bind(protocol)
        .bind(peer)
        .bind(id)
        .fetch_optional(conn)
        .await?)
}

/// Stores one attachment of message row `message_rowid`.
pub async fn insert_attachment(
    conn: &mut SqliteConnection,
    message_rowid: i64,
    a: &NewAttachment<'_>,
    now: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO am_attachments (message_rowid, part, name, media_type, size, data, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
    )
    .bind(message_rowid)
    .bind(a.part)
    .bind(a.name)
    .bind(a.media_type)
    .bind(i64::try_from(a.data.len()).unwrap_or(i64::MAX))
    .bind(a.data)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

/// Total bytes of every stored attachment of the profile.
pub async fn attachment_bytes(conn: &mut SqliteConnection) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT COALESCE(SUM(size), 0) FROM am_attachments").fetch_one(conn).await?)
}

impl Store {
    /// Our newest card.
    pub async fn am_current_card(&self) -> Result<Option<OwnCardRow>> {
        let row = sqlx::query("SELECT card, published_at FROM am_own_cards ORDER BY nonce DESC LIMIT 1")
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| OwnCardRow { card: r.get(0), published: r.get::<i64, _>(1) > 0 }))
    }

    /// Our cards (JCS) whose keys still open mail at `now`, newest first.
    pub async fn am_receiving_cards(&self, now: i64) -> Result<Vec<Vec<u8>>> {
        Ok(sqlx::query_scalar("SELECT card FROM am_own_cards WHERE receive_until > ? ORDER BY nonce DESC")
            .bind(now)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Marks our card `card_hash` accepted by the relay.
    pub async fn am_card_published(&self, card_hash: &str, now: i64) -> Result<()> {
        sqlx::query("UPDATE am_own_cards SET published_at = ? WHERE card_hash = ?")
            .bind(now)
            .bind(card_hash)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Forgets that the relay has any card of ours (it no longer knows our mailbox).
    pub async fn am_cards_unpublished(&self) -> Result<()> {
        sqlx::query("UPDATE am_own_cards SET published_at = 0").execute(&self.pool).await?;
        Ok(())
    }

    /// The content hash and deadline of the message `(me, sender, message_id)` we accepted.
    pub async fn am_received_commitment(
        &self,
        me: &str,
        sender: &str,
        message_id: &str,
    ) -> Result<Option<(String, i64)>> {
        let row = sqlx::query(
            "SELECT content_hash, expires_at FROM am_messages WHERE direction = 'in' AND recipient = ? AND sender = ? \
             AND message_id = ?",
        )
        .bind(me)
        .bind(sender)
        .bind(message_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }

    /// The message (JCS) and subject `sender` sent to `me` as `message_id`.
    pub async fn am_received(&self, me: &str, sender: &str, message_id: &str) -> Result<Option<(Vec<u8>, String)>> {
        let row = sqlx::query(
            "SELECT message, subject FROM am_messages WHERE direction = 'in' AND recipient = ? AND sender = ? \
             AND message_id = ?",
        )
        .bind(me)
        .bind(sender)
        .bind(message_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }

    /// The recipient and message (JCS) of what we sent as `sender` with `message_id`.
    pub async fn am_sent(&self, sender: &str, message_id: &str) -> Result<Option<(String, Vec<u8>)>> {
        let row = sqlx::query(AM_SENT).bind(sender).bind(message_id).fetch_optional(&self.pool).await?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }

    /// Subject and thread of the message `id` exchanged with `peer` (the sender of what we
    /// received, the recipient of what we sent).
    pub async fn am_subject_thread(&self, direction: &str, peer: &str, id: &str) -> Result<Option<(String, String)>> {
        let row = sqlx::query(AM_SUBJECT_THREAD).bind(direction).bind(peer).bind(id).fetch_optional(&self.pool).await?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }

    /// The attachments of message row `message_rowid`, by part index, without their bytes.
    pub async fn attachments(&self, message_rowid: i64) -> Result<Vec<AttachmentMeta>> {
        Ok(sqlx::query_as(
            "SELECT part, name, media_type, size FROM am_attachments WHERE message_rowid = ? ORDER BY part",
        )
        .bind(message_rowid)
        .fetch_all(&self.pool)
        .await?)
    }

    /// One attachment with its bytes.
    pub async fn attachment(&self, message_rowid: i64, part: i64) -> Result<Option<(AttachmentMeta, Vec<u8>)>> {
        let row = sqlx::query(
            "SELECT part, name, media_type, size, data FROM am_attachments WHERE message_rowid = ? AND part = ?",
        )
        .bind(message_rowid)
        .bind(part)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| {
            (AttachmentMeta { part: r.get(0), name: r.get(1), media_type: r.get(2), size: r.get(3) }, r.get(4))
        }))
    }

    /// Total bytes of every stored attachment of the profile.
    pub async fn attachment_total(&self) -> Result<i64> {
        attachment_bytes(&mut *self.pool.acquire().await?).await
    }
}
