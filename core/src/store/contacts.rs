//! The contacts table family: contacts (one row per peer per protocol, pinned keys, state, allow
//! list, roster) and their per-agent rules (`agent_rules`).
//!
//! Functions that must commit with other effects take a `&mut SqliteConnection`; the rest use the
//! pool.

use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection};

use super::{ContactRow, ContactState, Here, NewContact, Protocol, Result, Store};

/// Columns to change on one contact; `None` leaves a column as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct ContactUpdate<'a> {
    /// Local name.
    pub name: Option<&'a str>,
    /// `active` or `pending`.
    pub state: Option<ContactState>,
    /// Allowed kinds.
    pub allow_kinds: Option<&'a str>,
    /// letagents drop code.
    pub drop_code: Option<&'a [u8]>,
    /// Full address.
    pub address: Option<&'a str>,
    /// Relay override (`Some(None)` clears it).
    pub relay_url: Option<Option<&'a str>>,
    /// The pinned box key.
    pub box_pub: Option<&'a [u8]>,
    /// A different box key seen for this peer (`Some(None)` clears it).
    pub changed_box_pub: Option<Option<&'a [u8]>>,
    /// When it was seen (`Some(None)` clears it).
    pub key_changed_at: Option<Option<i64>>,
    /// Whether the user compared safety numbers.
    pub verified: Option<bool>,
    /// Their last roster (JSON).
    pub roster: Option<&'a str>,
    /// What their request said.
    pub request_body: Option<&'a str>,
}

impl ContactUpdate<'_> {
    fn is_empty(&self) -> bool {
        let ContactUpdate {
            name,
            state,
            allow_kinds,
            drop_code,
            address,
            relay_url,
            box_pub,
            changed_box_pub,
            key_changed_at,
            verified,
            roster,
            request_body,
        } = self;
        name.is_none()
            && state.is_none()
            && allow_kinds.is_none()
            && drop_code.is_none()
            && address.is_none()
            && relay_url.is_none()
            && box_pub.is_none()
            && changed_box_pub.is_none()
            && key_changed_at.is_none()
            && verified.is_none()
            && roster.is_none()
            && request_body.is_none()
    }
}

/// Applies `u` to contact `id`.
pub async fn update_contact(conn: &mut SqliteConnection, id: i64, u: &ContactUpdate<'_>) -> Result<()> {
    if u.is_empty() {
        return Ok(());
    }
    let mut q: QueryBuilder<Sqlite> = QueryBuilder::new("UPDATE contacts SET ");
    let mut set = q.separated(", ");
    if let Some(v) = u.name {
        set.push("name = ").push_bind_unseparated(v);
    }
    if let Some(v) = u.state {
        set.push("state = ").push_bind_unseparated(v);
    }
    if let Some(v) = u.allow_kinds {
        set.push("allow_kinds = ").push_bind_unseparated(v);
    }
    if let Some(v) = u.drop_code {
        set.push("drop_code = ").push_bind_unseparated(v);
    }
    if let Some(v) = u.address {
        set.push("address = ").push_bind_unseparated(v);
    }
    if let Some(v) = u.relay_url {
        set.push("relay_url = ").push_bind_unseparated(v);
    }
    if let Some(v) = u.box_pub {
        set.push("box_pub = ").push_bind_unseparated(v);
    }
    if let Some(v) = u.changed_box_pub {
        set.push("changed_box_pub = ").push_bind_unseparated(v);
    }
    if let Some(v) = u.key_changed_at {
        set.push("key_changed_at = ").push_bind_unseparated(v);
    }
    if let Some(v) = u.verified {
        set.push("verified = ").push_bind_unseparated(v);
    }
    if let Some(v) = u.roster {
        set.push("roster = ").push_bind_unseparated(v);
    }
    if let Some(v) = u.request_body {
        set.push("request_body = ").push_bind_unseparated(v);
    }
    q.push(" WHERE id = ").push_bind(id);
    q.build().execute(conn).await?;
    Ok(())
}

/// Inserts a contact, returning its id.
pub async fn insert_contact(conn: &mut SqliteConnection, c: &NewContact<'_>) -> Result<i64> {
    let id = sqlx::query(
        "INSERT INTO contacts (name, protocol, peer_id, address, sig_pub, box_pub, drop_code, relay_url, state, \
         allow_kinds, request_body, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(c.name)
    .bind(c.protocol)
    .bind(c.peer_id)
    .bind(c.address)
    .bind(c.sig_pub)
    .bind(c.box_pub)
    .bind(c.drop_code)
    .bind(c.relay_url)
    .bind(c.state)
    .bind(c.allow_kinds)
    .bind(c.request_body)
    .bind(c.now)
    .execute(conn)
    .await?
    .last_insert_rowid();
    Ok(id)
}

/// A contact by protocol id.
pub async fn contact_by_peer(
    conn: &mut SqliteConnection,
    protocol: Protocol,
    peer_id: &str,
) -> Result<Option<ContactRow>> {
    Ok(sqlx::query_as(CONTACT_BY_PEER).bind(protocol).bind(peer_id).fetch_optional(conn).await?)
}

const CONTACT_BY_PEER: &str = "SELECT * FROM contacts WHERE protocol = ? AND peer_id = ?";

const RULES_FOR: &str = "SELECT from_glob, to_glob, action FROM agent_rules WHERE contact_id = ? ORDER BY position, id";

impl Here<'_> {
    /// [`contact_by_peer`] in a transaction on the caller's thread.
    pub(crate) fn contact_by_peer(&self, protocol: Protocol, peer_id: &str) -> Result<Option<ContactRow>> {
        self.row(CONTACT_BY_PEER, (protocol.as_str(), peer_id), ContactRow::from_direct)
    }

    /// [`rules_for`] in a transaction on the caller's thread.
    pub(crate) fn rules_for(&self, contact_id: i64) -> Result<Vec<(String, String, String)>> {
        self.rows(RULES_FOR, [contact_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
    }
}

/// Whether `name` is taken.
pub async fn name_taken(conn: &mut SqliteConnection, name: &str) -> Result<bool> {
    Ok(sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM contacts WHERE name = ?").bind(name).fetch_one(conn).await?
        > 0)
}

/// How many contact requests are pending (a denied request is blocked, not pending).
pub async fn pending_requests(conn: &mut SqliteConnection) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM contacts WHERE state = 'pending' AND blocked = 0")
        .fetch_one(conn)
        .await?)
}

/// Blocks or unblocks contact `id`. Blocking also keeps what it sent while pending from ever
/// being shown (held messages become `blocked`, which accepting does not release) and takes
/// what agents have not acknowledged yet out of their queues (the queue's classifier skips a
/// blocked contact's messages it has not seen yet). Returns false when the contact
/// was already in that state.
pub async fn set_blocked(conn: &mut SqliteConnection, id: i64, blocked: bool, now: i64) -> Result<bool> {
    let changed = sqlx::query("UPDATE contacts SET blocked = ?1, blocked_at = ?2 WHERE id = ?3 AND blocked != ?1")
        .bind(blocked)
        .bind(if blocked { now } else { 0 })
        .bind(id)
        .execute(&mut *conn)
        .await?
        .rows_affected()
        > 0;
    if changed && blocked {
        sqlx::query("UPDATE messages SET state = 'blocked' WHERE contact_id = ? AND state = 'held'")
            .bind(id)
            .execute(&mut *conn)
            .await?;
        sqlx::query(
            // By agent and state (`agent_deliveries_queued`): the key wants the agent first.
            "UPDATE agent_deliveries SET state = 'skipped' WHERE agent IN (SELECT name FROM agents) \
             AND state IN ('queued', 'paused', 'handed') AND message IN (SELECT rowid_ FROM messages WHERE contact_id = ?)",
        )
        .bind(id)
        .execute(&mut *conn)
        .await?;
    }
    Ok(changed)
}

/// Counts one message of blocked contact `id` that was dropped.
pub async fn count_blocked_drop(conn: &mut SqliteConnection, id: i64) -> Result<()> {
    sqlx::query("UPDATE contacts SET blocked_dropped = blocked_dropped + 1 WHERE id = ?")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Shows what a contact sent while its request was pending (held messages become received and
/// unshown).
pub async fn release_held(conn: &mut SqliteConnection, contact_id: i64) -> Result<()> {
    sqlx::query("UPDATE messages SET state = 'received', shown = 0 WHERE contact_id = ? AND state = 'held'")
        .bind(contact_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// The agent rules of a contact, in order.
pub async fn rules_for(conn: &mut SqliteConnection, contact_id: i64) -> Result<Vec<(String, String, String)>> {
    let rows = sqlx::query(RULES_FOR).bind(contact_id).fetch_all(conn).await?;
    Ok(rows.into_iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
}

impl Store {
    /// All contacts in `state` (or all), by name. Pending requests (`Some(Pending)`) leave out
    /// the blocked ones: a denied request is no longer a request.
    pub async fn contacts(&self, state: Option<ContactState>) -> Result<Vec<ContactRow>> {
        Ok(sqlx::query_as(
            "SELECT * FROM contacts WHERE (?1 IS NULL OR (state = ?1 AND (?1 != 'pending' OR blocked = 0))) ORDER BY name",
        )
            .bind(state)
            .fetch_all(&self.pool)
            .await?)
    }

    /// A contact by local name.
    /// On the caller's thread (`store::direct`).
    pub fn contact_by_name(&self, name: &str) -> Result<Option<ContactRow>> {
        self.direct.row("SELECT * FROM contacts WHERE name = ?", [name], ContactRow::from_direct)
    }

    /// A contact by row id. On the caller's thread.
    pub fn contact_by_id(&self, id: i64) -> Result<Option<ContactRow>> {
        self.direct.row("SELECT * FROM contacts WHERE id = ?", [id], ContactRow::from_direct)
    }

    /// A contact's local name by row id.
    pub async fn contact_name(&self, id: i64) -> Result<Option<String>> {
        Ok(sqlx::query_scalar("SELECT name FROM contacts WHERE id = ?").bind(id).fetch_optional(&self.pool).await?)
    }

    /// A contact by protocol id.
    pub async fn contact_by_peer(&self, protocol: Protocol, peer_id: &str) -> Result<Option<ContactRow>> {
        contact_by_peer(&mut *self.pool.acquire().await?, protocol, peer_id).await
    }

    /// Applies `u` to contact `id`.
    pub async fn update_contact(&self, id: i64, u: &ContactUpdate<'_>) -> Result<()> {
        update_contact(&mut *self.pool.acquire().await?, id, u).await
    }

    /// Forgets a contact.
    pub async fn delete_contact(&self, id: i64) -> Result<()> {
        sqlx::query("DELETE FROM contacts WHERE id = ?").bind(id).execute(&self.pool).await?;
        Ok(())
    }

    /// Appends an agent rule to a contact's list; returns the list.
    pub async fn add_rule(
        &self,
        contact_id: i64,
        from: &str,
        to: &str,
        action: &str,
    ) -> Result<Vec<(String, String, String)>> {
        sqlx::query(
            "INSERT INTO agent_rules (contact_id, position, from_glob, to_glob, action) \
             VALUES (?1, (SELECT COALESCE(MAX(position), 0) + 1 FROM agent_rules WHERE contact_id = ?1), ?2, ?3, ?4)",
        )
        .bind(contact_id)
        .bind(from)
        .bind(to)
        .bind(action)
        .execute(&self.pool)
        .await?;
        rules_for(&mut *self.pool.acquire().await?, contact_id).await
    }
}
