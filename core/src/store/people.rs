//! People (migration 0013): one name and one safety number over several contact rows, one per
//! protocol, made by adding a Switchboard contact link; and the outbox's record of a message
//! another channel carried after its own failed.

use sqlx::SqliteConnection;

use super::{ContactRow, Result, Store};

/// A person row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PersonRow {
    /// Row id.
    pub id: i64,
    /// Local name (unique among people).
    pub name: String,
    /// The Ed25519 key that signed their link.
    pub identity_key: Vec<u8>,
    /// Their one safety number.
    pub safety_number: String,
    /// The newest link they shared.
    pub link: String,
    /// When added.
    pub created_at: i64,
}

/// The person with identity key `key`, if known.
pub async fn person_by_key(conn: &mut SqliteConnection, key: &[u8]) -> Result<Option<PersonRow>> {
    Ok(sqlx::query_as("SELECT * FROM people WHERE identity_key = ?").bind(key).fetch_optional(conn).await?)
}

/// Whether `name` names a person.
pub async fn person_name_taken(conn: &mut SqliteConnection, name: &str) -> Result<bool> {
    Ok(sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM people WHERE name = ?").bind(name).fetch_one(conn).await? > 0)
}

/// Inserts a person, returning its id.
pub async fn insert_person(
    conn: &mut SqliteConnection,
    name: &str,
    key: &[u8],
    safety_number: &str,
    link: &str,
    now: i64,
) -> Result<i64> {
    Ok(sqlx::query("INSERT INTO people (name, identity_key, safety_number, link, created_at) VALUES (?, ?, ?, ?, ?)")
        .bind(name)
        .bind(key)
        .bind(safety_number)
        .bind(link)
        .bind(now)
        .execute(conn)
        .await?
        .last_insert_rowid())
}

/// Makes contact `contact_id` a channel of person `person_id`.
pub async fn set_contact_person(conn: &mut SqliteConnection, contact_id: i64, person_id: i64) -> Result<()> {
    sqlx::query("UPDATE contacts SET person_id = ? WHERE id = ?")
        .bind(person_id)
        .bind(contact_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Takes contact `contact_id` out of its person: a contact of its own again (`contact split`).
pub async fn clear_contact_person(conn: &mut SqliteConnection, contact_id: i64) -> Result<()> {
    sqlx::query("UPDATE contacts SET person_id = NULL WHERE id = ?").bind(contact_id).execute(conn).await?;
    Ok(())
}

/// Renames a contact row (a channel named after its person follows the person's name).
pub async fn rename_contact(conn: &mut SqliteConnection, contact_id: i64, name: &str) -> Result<()> {
    sqlx::query("UPDATE contacts SET name = ? WHERE id = ?").bind(name).bind(contact_id).execute(conn).await?;
    Ok(())
}

/// Renames a person.
pub async fn rename_person(conn: &mut SqliteConnection, person_id: i64, name: &str) -> Result<()> {
    sqlx::query("UPDATE people SET name = ? WHERE id = ?").bind(name).bind(person_id).execute(conn).await?;
    Ok(())
}

/// Deletes a person row whose channels went to another person (`contact merge`).
pub async fn delete_person(conn: &mut SqliteConnection, person_id: i64) -> Result<()> {
    sqlx::query("DELETE FROM people WHERE id = ?").bind(person_id).execute(conn).await?;
    Ok(())
}

/// Records that outgoing message `original` was carried as `new_id` by another channel: the new
/// message names the original, the original becomes `rerouted` (with `detail` saying where and
/// why) and leaves the outbox. One transaction.
pub async fn record_fallback(
    conn: &mut SqliteConnection,
    outbox_id: i64,
    original: &str,
    new_id: &str,
    detail: &str,
) -> Result<()> {
    // Named (0021): SQLite would otherwise walk every outgoing entry of the unique index.
    sqlx::query("UPDATE messages INDEXED BY messages_by_id SET fallback_of = ? WHERE direction = 'out' AND id = ?")
        .bind(original)
        .bind(new_id)
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "UPDATE messages INDEXED BY messages_by_id SET state = 'rerouted', detail = ? \
         WHERE direction = 'out' AND id = ?",
    )
    .bind(detail)
    .bind(original)
    .execute(&mut *conn)
    .await?;
    sqlx::query("DELETE FROM outbox WHERE id = ?").bind(outbox_id).execute(&mut *conn).await?;
    Ok(())
}

/// [`Store::last_send_failed`]: the contact's newest rows first, in `messages_by_contact` (0021).
pub(crate) const LAST_SEND_FAILED: &str = "SELECT state FROM messages WHERE contact_id = ? AND direction = 'out' \
     AND kind IN ('send', 'ask', 'reply') AND state != 'queued' ORDER BY rowid_ DESC LIMIT 1";

/// [`Store::fell_back_from`]: in `messages_fallbacks` (0021), which `fallback_of != ''` lets SQLite use.
pub(crate) const FELL_BACK_FROM: &str =
    "SELECT COUNT(*) FROM messages WHERE direction = 'out' AND fallback_of = ? AND fallback_of != ''";

/// [`Store::person_conversation`]: each channel's newest rows, in `messages_by_contact` (0021).
pub(crate) const PERSON_CONVERSATION: &str = "SELECT * FROM (SELECT m.* FROM messages m JOIN contacts c \
     ON c.id = m.contact_id WHERE c.person_id = ?1 AND m.kind NOT IN ('receipt', 'roster', 'hello') \
     AND m.state != 'rerouted' ORDER BY m.rowid_ DESC LIMIT ?2) ORDER BY rowid_";

impl Store {
    /// Every person, by name.
    pub async fn people(&self) -> Result<Vec<PersonRow>> {
        Ok(sqlx::query_as("SELECT * FROM people ORDER BY name").fetch_all(&self.pool).await?)
    }

    /// A person by local name.
    /// On the caller's thread (`store::direct`).
    pub fn person_by_name(&self, name: &str) -> Result<Option<PersonRow>> {
        self.direct.row("SELECT * FROM people WHERE name = ?", [name], PersonRow::from_direct)
    }

    /// A person by row id.
    pub async fn person_by_id(&self, id: i64) -> Result<Option<PersonRow>> {
        Ok(sqlx::query_as("SELECT * FROM people WHERE id = ?").bind(id).fetch_optional(&self.pool).await?)
    }

    /// The contact rows (channels) of person `id`.
    /// On the caller's thread.
    pub fn person_channels(&self, id: i64) -> Result<Vec<ContactRow>> {
        self.direct.rows("SELECT * FROM contacts WHERE person_id = ? ORDER BY id", [id], ContactRow::from_direct)
    }

    /// Whether the newest message we sent on contact `id` failed there (moved to another
    /// channel, refused, or given up): the channel looks unreachable until one gets through.
    pub async fn last_send_failed(&self, id: i64) -> Result<bool> {
        let state: Option<String> = sqlx::query_scalar(LAST_SEND_FAILED).bind(id).fetch_optional(&self.pool).await?;
        Ok(state.is_some_and(|s| matches!(s.as_str(), "rerouted" | "failed" | "refused")))
    }

    /// Whether some message was already carried by another channel in place of `original`.
    pub async fn fell_back_from(&self, original: &str) -> Result<bool> {
        Ok(sqlx::query_scalar::<_, i64>(FELL_BACK_FROM).bind(original).fetch_one(&self.pool).await? > 0)
    }

    /// The conversation with every channel of person `id`, oldest first (receipts, rosters and
    /// the hellos that introduced each channel and messages another channel carried instead are
    /// left out).
    pub async fn person_conversation(&self, id: i64, limit: i64) -> Result<Vec<super::MessageRow>> {
        Ok(sqlx::query_as(PERSON_CONVERSATION).bind(id).bind(limit).fetch_all(&self.pool).await?)
    }
}
