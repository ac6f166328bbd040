//! Stringcup v2 on PostgreSQL: the same requests and outcomes as [`crate::store::stringcup`].
//!
//! Where a write reads what it then changes, it locks the row that owns the decision first, so
//! instances take turns on it:
//! - a send locks the recipient's identity row before the pending limits and its number
//!   (`next_inbox_id`, a per-inbox counter: a reader's cursor never skips a late commit);
//! - an idempotency key is reserved by its primary key: the second instance inserting it waits
//!   for the first's commit, then finds the row and answers the replay;
//! - adding members locks the topic row (the member limit); a claim or release locks the
//!   rendezvous row (one responder); an update locks the identity row.
//!
//! Each of those writes also names its key to the batch (`store::writer::Request::locks`),
//! so batches of different instances take their locks in one order and never deadlock.
//!
//! The sweep takes an advisory lock first: one instance sweeps Stringcup at a time. Wake-ups
//! (an inbox's newest id, a rendezvous' version) go out with the batch's `NOTIFY`.

use async_trait::async_trait;
use sqlx::{PgConnection, PgExecutor};

use super::{PgStore, sweep_lock, try_sweep_lock};
use crate::hub::Committed;
use crate::store::StoreError;
use crate::store::stringcup::{
    Ack, AckOutcome, AddMembers, AddOutcome, Counts, CreateTopic, DeleteOutcome, DeleteTopic, IdentityRow,
    InitialMembers, JoinOutcome, JoinRendezvous, NewMessage, OpenRendezvous, Opened, Pending, PendingCaps, Register,
    ReleaseRendezvous, Released, RemoveMember, RemoveOutcome, RendezvousRow, Role, Rotate, ScSweepReport, SendOutcome,
    SendRequest, StoredMessage, StringcupStore, Sweep, TokenRow, TopicCreated, TopicRow, Touch, Update, Updated, count,
    is_topic_id, rendezvous_key,
};
use crate::store::writer::request;

/// Counter shards: a writer adds to shard `pg_backend_pid() % SHARDS` of a counter.
const COUNTER_SHARDS: i32 = 64;

async fn exists(conn: &mut PgConnection, identity: &str) -> Result<bool, sqlx::Error> {
    let found: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM sc_identity WHERE id = $1").bind(identity).fetch_optional(&mut *conn).await?;
    Ok(found.is_some())
}

async fn register(conn: &mut PgConnection, r: &Register) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(
        "INSERT INTO sc_identity (id, public_key, algo, display_name, token_hash, token_created_ms, \
         token_last_used_ms, key_updated_ms, updated_ms, created_ms) \
         VALUES ($1, $2, 'x25519', $3, $4, $5, $5, $5, $5, $5) ON CONFLICT DO NOTHING",
    )
    .bind(&r.id)
    .bind(&r.public_key)
    .bind(&r.display_name)
    .bind(&r.token_hash)
    .bind(r.now)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(inserted == 1)
}

const IDENTITY_COLUMNS: &str = "id, public_key, algo, display_name, key_updated_ms, updated_ms, created_ms";

async fn identity_row(db: impl PgExecutor<'_>, id: &str, lock: bool) -> Result<Option<IdentityRow>, sqlx::Error> {
    let sql =
        format!("SELECT {IDENTITY_COLUMNS} FROM sc_identity WHERE id = $1{}", if lock { " FOR UPDATE" } else { "" });
    sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(id).fetch_optional(db).await
}

async fn update(conn: &mut PgConnection, u: &Update) -> Result<Option<Updated>, sqlx::Error> {
    let Some(before) = identity_row(&mut *conn, &u.identity, true).await? else {
        return Ok(None);
    };
    let key_changed = u.public_key.as_ref().is_some_and(|k| *k != before.public_key);
    let name_changed = u.display_name.as_ref().is_some_and(|n| *n != before.display_name);
    if key_changed || name_changed {
        sqlx::query(
            "UPDATE sc_identity SET public_key = $1, display_name = $2, updated_ms = $3, \
             key_updated_ms = CASE WHEN $4 THEN $3 ELSE key_updated_ms END WHERE id = $5",
        )
        .bind(u.public_key.as_ref().unwrap_or(&before.public_key))
        .bind(u.display_name.as_ref().unwrap_or(&before.display_name))
        .bind(u.now)
        .bind(key_changed)
        .bind(&u.identity)
        .execute(&mut *conn)
        .await?;
    }
    let row = identity_row(&mut *conn, &u.identity, false).await?;
    Ok(row.map(|row| Updated { row, key_changed }))
}

async fn touch(conn: &mut PgConnection, t: &Touch) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE sc_identity SET token_last_used_ms = GREATEST(token_last_used_ms, $1) WHERE id = $2")
        .bind(t.now)
        .bind(&t.identity)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

async fn rotate(conn: &mut PgConnection, r: &Rotate) -> Result<bool, sqlx::Error> {
    let changed = sqlx::query(
        "UPDATE sc_identity SET token_hash = $1, token_created_ms = $2, token_last_used_ms = $2 \
         WHERE id = $3 AND token_hash = $4",
    )
    .bind(&r.new_hash)
    .bind(r.now)
    .bind(&r.identity)
    .bind(&r.old_hash)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(changed == 1)
}

async fn store_one(
    conn: &mut PgConnection,
    sender: &str,
    m: &NewMessage,
    caps: PendingCaps,
    now: i64,
) -> Result<SendOutcome, sqlx::Error> {
    // The lock that makes the limits and the number one step across instances; the pending
    // counters (migration 0005) are read under it.
    let next: Option<(i64, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT i.next_inbox_id, COALESCE(s.messages, 0), COALESCE(s.bytes, 0), i.pending_messages, i.pending_bytes \
         FROM sc_identity AS i LEFT JOIN sc_pending_share AS s ON s.recipient = i.id AND s.sender = $2 \
         WHERE i.id = $1 FOR UPDATE OF i",
    )
    .bind(&m.recipient)
    .bind(sender)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((inbox_id, sender_n, sender_bytes, inbox_n, inbox_bytes)) = next else {
        return Ok(SendOutcome::NoRecipient);
    };
    let size = u64::try_from(m.size()).unwrap_or(u64::MAX);
    if let Some(limit) = Pending::from_row((sender_n, sender_bytes, inbox_n, inbox_bytes)).over_limit(size, caps) {
        return Ok(SendOutcome::Full(limit));
    }
    sqlx::query("UPDATE sc_identity SET next_inbox_id = $1 WHERE id = $2")
        .bind(inbox_id + 1)
        .bind(&m.recipient)
        .execute(&mut *conn)
        .await?;
    let sent_seq: i64 = sqlx::query_scalar(
        "UPDATE sc_identity SET next_sent_seq = next_sent_seq + 1 WHERE id = $1 RETURNING next_sent_seq - 1",
    )
    .bind(sender)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO sc_message (recipient, id, sender, sent_seq, ephemeral_pub, iv, header_extra, ciphertext, size, \
         created_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(&m.recipient)
    .bind(inbox_id)
    .bind(sender)
    .bind(sent_seq)
    .bind(&m.ephemeral_pub)
    .bind(&m.iv)
    .bind(&m.header_extra)
    .bind(&m.ciphertext)
    .bind(i64::try_from(size).unwrap_or(i64::MAX))
    .bind(now)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO sc_counter (name, shard, value) VALUES ('messages_stored', pg_backend_pid() % $1, 1) \
         ON CONFLICT (name, shard) DO UPDATE SET value = sc_counter.value + 1",
    )
    .bind(COUNTER_SHARDS)
    .execute(&mut *conn)
    .await?;
    Ok(SendOutcome::Stored { sent_seq, inbox_id })
}

async fn send(conn: &mut PgConnection, s: &SendRequest) -> Result<Vec<SendOutcome>, sqlx::Error> {
    if !exists(conn, &s.sender).await? {
        return Ok(vec![SendOutcome::NoSender; s.messages.len()]);
    }
    let key = match (&s.idempotency_key, s.messages.as_slice()) {
        (Some(key), [message]) => Some((key, message)),
        _ => None,
    };
    let Some((key, message)) = key else {
        let mut out = Vec::with_capacity(s.messages.len());
        for message in &s.messages {
            out.push(store_one(conn, &s.sender, message, s.caps, s.now).await?);
        }
        return Ok(out);
    };
    sqlx::query("DELETE FROM sc_idempotency WHERE sender = $1 AND key = $2 AND created_ms < $3")
        .bind(&s.sender)
        .bind(key)
        .bind(s.idempotency_expired_before)
        .execute(&mut *conn)
        .await?;
    // The reservation: another instance inserting the same key waits here for our commit (or
    // we for theirs), then finds the row. A row that vanished between the two statements (its
    // holder rolled back, or the sweep forgot it) is reserved again.
    for _ in 0..3 {
        let reserved = sqlx::query(
            "INSERT INTO sc_idempotency (sender, key, recipient, sent_seq, created_ms) VALUES ($1, $2, $3, 0, $4) \
             ON CONFLICT DO NOTHING",
        )
        .bind(&s.sender)
        .bind(key)
        .bind(&message.recipient)
        .bind(s.now)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if reserved == 1 {
            return Ok(vec![store_reserved(conn, s, key, message).await?]);
        }
        let found: Option<(String, i64)> =
            sqlx::query_as("SELECT recipient, sent_seq FROM sc_idempotency WHERE sender = $1 AND key = $2")
                .bind(&s.sender)
                .bind(key)
                .fetch_optional(&mut *conn)
                .await?;
        match found {
            Some((recipient, sent_seq)) if recipient == message.recipient => {
                return Ok(vec![SendOutcome::Replay { sent_seq }]);
            }
            Some(_) => return Ok(vec![SendOutcome::KeyReused]),
            None => continue,
        }
    }
    Err(sqlx::Error::Protocol("an idempotency key kept vanishing while it was reserved".into()))
}

/// Stores the one message of `s` under the key it reserved; only a stored message keeps it.
async fn store_reserved(
    conn: &mut PgConnection,
    s: &SendRequest,
    key: &str,
    message: &NewMessage,
) -> Result<SendOutcome, sqlx::Error> {
    let outcome = store_one(conn, &s.sender, message, s.caps, s.now).await?;
    match outcome {
        SendOutcome::Stored { sent_seq, .. } => {
            sqlx::query("UPDATE sc_idempotency SET sent_seq = $1 WHERE sender = $2 AND key = $3")
                .bind(sent_seq)
                .bind(&s.sender)
                .bind(key)
                .execute(&mut *conn)
                .await?;
        }
        // Only a send that stored a message consumes its key.
        _ => {
            sqlx::query("DELETE FROM sc_idempotency WHERE sender = $1 AND key = $2")
                .bind(&s.sender)
                .bind(key)
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(outcome)
}

async fn ack(conn: &mut PgConnection, a: &Ack) -> Result<AckOutcome, sqlx::Error> {
    let deleted: Vec<i64> =
        sqlx::query_scalar("DELETE FROM sc_message WHERE recipient = $1 AND id = ANY($2) RETURNING id")
            .bind(&a.identity)
            .bind(&a.ids)
            .fetch_all(&mut *conn)
            .await?;
    let deleted: std::collections::BTreeSet<i64> = deleted.into_iter().collect();
    let mut out = AckOutcome::default();
    for &id in &a.ids {
        if deleted.contains(&id) { out.acknowledged.push(id) } else { out.not_found.push(id) }
    }
    Ok(out)
}

const TOPIC_FOR_MEMBER: &str = "SELECT t.id, t.owner, t.created_ms, \
     (SELECT COUNT(*) FROM sc_topic_member AS c WHERE c.topic = t.id) AS member_count \
     FROM sc_topic AS t JOIN sc_topic_member AS m ON m.topic = t.id AND m.member = $1 \
     WHERE ($2 AND t.id = $3) OR (NOT $2 AND t.legacy_name <> '' AND t.legacy_name = $3)";

/// The topic `reference` names (an issued id, or a legacy name), if `caller` is a member.
async fn topic_for_member(
    db: impl PgExecutor<'_>,
    reference: &str,
    caller: &str,
) -> Result<Option<TopicRow>, sqlx::Error> {
    sqlx::query_as(TOPIC_FOR_MEMBER).bind(caller).bind(is_topic_id(reference)).bind(reference).fetch_optional(db).await
}

/// As [`topic_for_member`], inside a write: the topic row is locked first, so the member
/// count read after it is the one the write changes.
async fn locked_topic_for_member(
    conn: &mut PgConnection,
    reference: &str,
    caller: &str,
) -> Result<Option<TopicRow>, sqlx::Error> {
    let by_id = is_topic_id(reference);
    let locked: Option<String> = sqlx::query_scalar(
        "SELECT id FROM sc_topic WHERE ($1 AND id = $2) OR (NOT $1 AND legacy_name <> '' AND legacy_name = $2) \
         FOR UPDATE",
    )
    .bind(by_id)
    .bind(reference)
    .fetch_optional(&mut *conn)
    .await?;
    if locked.is_none() {
        return Ok(None);
    }
    topic_for_member(&mut *conn, reference, caller).await
}

async fn create_topic(conn: &mut PgConnection, c: &CreateTopic) -> Result<TopicCreated, sqlx::Error> {
    if !exists(conn, &c.owner).await? {
        return Ok(TopicCreated::NoCaller);
    }
    let mut initial = InitialMembers::default();
    for id in &c.members {
        if *id == c.owner {
            initial.already.push(id.clone());
        } else if exists(conn, id).await? {
            initial.added.push(id.clone());
        } else {
            initial.unknown.push(id.clone());
        }
    }
    initial.members = u64::try_from(initial.added.len()).unwrap_or(u64::MAX).saturating_add(1);
    if !initial.added.is_empty() && initial.members > c.max_members {
        return Ok(TopicCreated::Full);
    }
    let inserted =
        sqlx::query("INSERT INTO sc_topic (id, owner, created_ms) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING")
            .bind(&c.id)
            .bind(&c.owner)
            .bind(c.now)
            .execute(&mut *conn)
            .await?
            .rows_affected();
    if inserted == 0 {
        return Ok(TopicCreated::IdTaken);
    }
    // The owner first: rosters list members in the order they joined.
    for member in std::iter::once(&c.owner).chain(&initial.added) {
        sqlx::query("INSERT INTO sc_topic_member (topic, member, added_ms) VALUES ($1, $2, $3)")
            .bind(&c.id)
            .bind(member)
            .bind(c.now)
            .execute(&mut *conn)
            .await?;
    }
    Ok(TopicCreated::Created(initial))
}

async fn is_member(conn: &mut PgConnection, topic: &str, identity: &str) -> Result<bool, sqlx::Error> {
    let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM sc_topic_member WHERE topic = $1 AND member = $2")
        .bind(topic)
        .bind(identity)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(found.is_some())
}

async fn add_members(conn: &mut PgConnection, a: &AddMembers) -> Result<AddOutcome, sqlx::Error> {
    let Some(topic) = locked_topic_for_member(conn, &a.topic, &a.caller).await? else {
        return Ok(AddOutcome::NotFound);
    };
    if topic.owner != a.caller {
        return Ok(AddOutcome::NotOwner);
    }
    let (mut added, mut already, mut unknown) = (Vec::new(), Vec::new(), Vec::new());
    for id in &a.ids {
        if is_member(conn, &topic.id, id).await? {
            already.push(id.clone());
        } else if exists(conn, id).await? {
            added.push(id.clone());
        } else {
            unknown.push(id.clone());
        }
    }
    let members = count(topic.member_count);
    let after = members.saturating_add(u64::try_from(added.len()).unwrap_or(u64::MAX));
    if after > a.max_members {
        return Ok(AddOutcome::Full { members });
    }
    for id in &added {
        sqlx::query("INSERT INTO sc_topic_member (topic, member, added_ms) VALUES ($1, $2, $3)")
            .bind(&topic.id)
            .bind(id)
            .bind(a.now)
            .execute(&mut *conn)
            .await?;
    }
    Ok(AddOutcome::Added { topic: topic.id, added, already, unknown, members: after })
}

async fn remove_member(conn: &mut PgConnection, r: &RemoveMember) -> Result<RemoveOutcome, sqlx::Error> {
    let Some(topic) = locked_topic_for_member(conn, &r.topic, &r.caller).await? else {
        return Ok(RemoveOutcome::NotFound);
    };
    if r.member != r.caller && topic.owner != r.caller {
        return Ok(RemoveOutcome::NotOwner);
    }
    if r.member == topic.owner {
        return Ok(RemoveOutcome::OwnerStays);
    }
    let removed = sqlx::query("DELETE FROM sc_topic_member WHERE topic = $1 AND member = $2")
        .bind(&topic.id)
        .bind(&r.member)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    Ok(if removed == 0 { RemoveOutcome::NotMember } else { RemoveOutcome::Removed(topic.id) })
}

async fn delete_topic(conn: &mut PgConnection, d: &DeleteTopic) -> Result<DeleteOutcome, sqlx::Error> {
    let Some(topic) = locked_topic_for_member(conn, &d.topic, &d.caller).await? else {
        return Ok(DeleteOutcome::NotFound);
    };
    if topic.owner != d.caller {
        return Ok(DeleteOutcome::NotOwner);
    }
    sqlx::query("DELETE FROM sc_topic WHERE id = $1").bind(&topic.id).execute(&mut *conn).await?;
    Ok(DeleteOutcome::Deleted(topic.id))
}

async fn open_rendezvous(conn: &mut PgConnection, o: &OpenRendezvous) -> Result<Opened, sqlx::Error> {
    if !exists(conn, &o.identity).await? {
        return Ok(Opened::NoCaller);
    }
    let inserted = sqlx::query(
        "INSERT INTO sc_rendezvous (token_hash, created_ms, expires_ms, version) VALUES ($1, $2, $3, 1) \
         ON CONFLICT DO NOTHING",
    )
    .bind(&o.token_hash)
    .bind(o.now)
    .bind(o.expires_ms)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Ok(Opened::TokenTaken);
    }
    sqlx::query("INSERT INTO sc_rendezvous_claim (token_hash, role, identity, claimed_ms) VALUES ($1, $2, $3, $4)")
        .bind(&o.token_hash)
        .bind(Role::Initiator.as_str())
        .bind(&o.identity)
        .bind(o.now)
        .execute(&mut *conn)
        .await?;
    Ok(Opened::Opened)
}

async fn bump(conn: &mut PgConnection, token_hash: &[u8]) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("UPDATE sc_rendezvous SET version = version + 1 WHERE token_hash = $1 RETURNING version")
        .bind(token_hash)
        .fetch_one(&mut *conn)
        .await
}

/// An unexpired rendezvous with its claims; `lock` locks its row first (inside a write).
async fn rendezvous_row(
    conn: &mut PgConnection,
    token_hash: &[u8],
    now: i64,
    lock: bool,
) -> Result<Option<RendezvousRow>, sqlx::Error> {
    let sql = if lock {
        "SELECT expires_ms, version FROM sc_rendezvous WHERE token_hash = $1 AND expires_ms > $2 FOR UPDATE"
    } else {
        "SELECT expires_ms, version FROM sc_rendezvous WHERE token_hash = $1 AND expires_ms > $2"
    };
    let head: Option<(i64, i64)> = sqlx::query_as(sql).bind(token_hash).bind(now).fetch_optional(&mut *conn).await?;
    let Some((expires_ms, version)) = head else {
        return Ok(None);
    };
    let claims: Vec<(String, String)> =
        sqlx::query_as("SELECT role, identity FROM sc_rendezvous_claim WHERE token_hash = $1 ORDER BY role")
            .bind(token_hash)
            .fetch_all(&mut *conn)
            .await?;
    let claims = claims.into_iter().filter_map(|(role, who)| Role::parse(&role).map(|r| (r, who))).collect();
    Ok(Some(RendezvousRow { expires_ms, version, claims }))
}

async fn join_rendezvous(conn: &mut PgConnection, j: &JoinRendezvous) -> Result<(JoinOutcome, i64), sqlx::Error> {
    let Some(row) = rendezvous_row(&mut *conn, &j.token_hash, j.now, true).await? else {
        return Ok((JoinOutcome::Unknown, 0));
    };
    if let Some((role, _)) = row.claims.iter().find(|(_, who)| *who == j.identity) {
        return Ok((JoinOutcome::Holds(*role), row.version));
    }
    if row.claims.iter().any(|(role, _)| *role == Role::Responder) {
        return Ok((JoinOutcome::RoleTaken, row.version));
    }
    if !exists(conn, &j.identity).await? {
        return Ok((JoinOutcome::Unknown, 0));
    }
    sqlx::query("INSERT INTO sc_rendezvous_claim (token_hash, role, identity, claimed_ms) VALUES ($1, $2, $3, $4)")
        .bind(&j.token_hash)
        .bind(Role::Responder.as_str())
        .bind(&j.identity)
        .bind(j.now)
        .execute(&mut *conn)
        .await?;
    let version = bump(conn, &j.token_hash).await?;
    Ok((JoinOutcome::Holds(Role::Responder), version))
}

async fn release_rendezvous(conn: &mut PgConnection, r: &ReleaseRendezvous) -> Result<(Released, i64), sqlx::Error> {
    let Some(row) = rendezvous_row(&mut *conn, &r.token_hash, r.now, true).await? else {
        return Ok((None, 0));
    };
    let Some((role, _)) = row.claims.iter().find(|(_, who)| *who == r.identity) else {
        return Ok((None, row.version));
    };
    sqlx::query("DELETE FROM sc_rendezvous_claim WHERE token_hash = $1 AND identity = $2")
        .bind(&r.token_hash)
        .bind(&r.identity)
        .execute(&mut *conn)
        .await?;
    let version = bump(conn, &r.token_hash).await?;
    if row.claims.len() == 1 {
        sqlx::query("DELETE FROM sc_rendezvous WHERE token_hash = $1").bind(&r.token_hash).execute(&mut *conn).await?;
    }
    Ok((Some(*role), version))
}

async fn sweep(conn: &mut PgConnection, s: &Sweep) -> Result<ScSweepReport, sqlx::Error> {
    if !try_sweep_lock(conn, sweep_lock::STRINGCUP).await? {
        tracing::debug!("another instance is sweeping stringcup");
        return Ok(ScSweepReport::default());
    }
    let identities = sqlx::query("DELETE FROM sc_identity WHERE token_last_used_ms < $1")
        .bind(s.tokens_unused_since)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    let idempotency_keys = sqlx::query("DELETE FROM sc_idempotency WHERE created_ms < $1")
        .bind(s.idempotency_before)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    let rendezvous = sqlx::query("DELETE FROM sc_rendezvous WHERE expires_ms <= $1")
        .bind(s.now)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    Ok(ScSweepReport { identities, idempotency_keys, rendezvous })
}

/// The batch lock key of an identity's row (its counters, token and inbox limits).
fn identity_lock(id: &str) -> String {
    format!("sc/id/{id}")
}

request!(PgConnection, Register => bool, register);
request!(PgConnection, Update => Option<Updated>, update, {
    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(identity_lock(&self.identity));
    }
});
request!(PgConnection, Touch => (), touch, {
    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(identity_lock(&self.identity));
    }
});
request!(PgConnection, Rotate => bool, rotate, {
    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(identity_lock(&self.identity));
    }
});
request!(PgConnection, SendRequest => Vec<SendOutcome>, send, {
    fn bytes(&self) -> usize {
        self.payload_bytes()
    }

    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(identity_lock(&self.sender));
        keys.extend(self.messages.iter().map(|m| identity_lock(&m.recipient)));
    }

    fn more_wakeups(&self, out: &Vec<SendOutcome>) -> Vec<(String, i64, Option<Committed>)> {
        self.wakeups_for(out)
    }
});
request!(PgConnection, Ack => AckOutcome, ack, {
    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(identity_lock(&self.identity));
    }
});
request!(PgConnection, CreateTopic => TopicCreated, create_topic);
request!(PgConnection, AddMembers => AddOutcome, add_members, {
    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(format!("sc/tp/{}", self.topic));
    }
});
request!(PgConnection, RemoveMember => RemoveOutcome, remove_member, {
    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(format!("sc/tp/{}", self.topic));
    }
});
request!(PgConnection, DeleteTopic => DeleteOutcome, delete_topic, {
    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(format!("sc/tp/{}", self.topic));
    }
});
request!(PgConnection, OpenRendezvous => Opened, open_rendezvous);
request!(PgConnection, JoinRendezvous => (JoinOutcome, i64), join_rendezvous, {
    fn wakeup(&self, out: &(JoinOutcome, i64)) -> Option<(String, i64)> {
        self.wakeup_for(out)
    }

    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(rendezvous_key(&self.token_hash));
    }
});
request!(PgConnection, ReleaseRendezvous => (Released, i64), release_rendezvous, {
    fn wakeup(&self, out: &(Released, i64)) -> Option<(String, i64)> {
        self.wakeup_for(out)
    }

    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(rendezvous_key(&self.token_hash));
    }
});
request!(PgConnection, Sweep => ScSweepReport, sweep);

#[async_trait]
impl StringcupStore for PgStore {
    async fn register(&self, req: Register) -> Result<bool, StoreError> {
        self.submit(req).await
    }

    async fn update(&self, req: Update) -> Result<Option<Updated>, StoreError> {
        self.submit(req).await
    }

    async fn touch(&self, identity: &str, now: i64) -> Result<(), StoreError> {
        self.submit(Touch { identity: identity.to_owned(), now }).await
    }

    async fn rotate(&self, req: Rotate) -> Result<bool, StoreError> {
        self.submit(req).await
    }

    async fn send(&self, req: SendRequest) -> Result<Vec<SendOutcome>, StoreError> {
        self.submit(req).await
    }

    async fn ack(&self, identity: &str, ids: Vec<i64>) -> Result<AckOutcome, StoreError> {
        self.submit(Ack { identity: identity.to_owned(), ids }).await
    }

    async fn create_topic(&self, req: CreateTopic) -> Result<TopicCreated, StoreError> {
        self.submit(req).await
    }

    async fn add_members(&self, req: AddMembers) -> Result<AddOutcome, StoreError> {
        self.submit(req).await
    }

    async fn remove_member(&self, req: RemoveMember) -> Result<RemoveOutcome, StoreError> {
        self.submit(req).await
    }

    async fn delete_topic(&self, req: DeleteTopic) -> Result<DeleteOutcome, StoreError> {
        self.submit(req).await
    }

    async fn open_rendezvous(&self, req: OpenRendezvous) -> Result<Opened, StoreError> {
        self.submit(req).await
    }

    async fn join_rendezvous(&self, req: JoinRendezvous) -> Result<(JoinOutcome, i64), StoreError> {
        self.submit(req).await
    }

    async fn release_rendezvous(&self, req: ReleaseRendezvous) -> Result<Released, StoreError> {
        Ok(self.submit(req).await?.0)
    }

    async fn sweep(&self, req: Sweep) -> Result<ScSweepReport, StoreError> {
        self.submit(req).await
    }

    async fn by_token(&self, token_hash: &[u8]) -> Result<Option<TokenRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT id AS identity, token_created_ms, token_last_used_ms FROM sc_identity WHERE token_hash = $1",
        )
        .bind(token_hash)
        .fetch_optional(&self.read)
        .await?)
    }

    async fn identity(&self, id: &str) -> Result<Option<IdentityRow>, StoreError> {
        Ok(identity_row(&self.read, id, false).await?)
    }

    async fn inbox(&self, recipient: &str, since: i64, limit: usize) -> Result<Vec<StoredMessage>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT id, sender, header_version, header_algo, ephemeral_pub, iv, header_extra, ciphertext, created_ms \
             FROM sc_message WHERE recipient = $1 AND id > $2 ORDER BY id LIMIT $3",
        )
        .bind(recipient)
        .bind(since)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.read)
        .await?)
    }

    async fn newest_inbox_id(&self, recipient: &str) -> Result<i64, StoreError> {
        let next: Option<i64> = sqlx::query_scalar("SELECT next_inbox_id FROM sc_identity WHERE id = $1")
            .bind(recipient)
            .fetch_optional(&self.read)
            .await?;
        Ok(next.map_or(0, |n| n - 1))
    }

    async fn topics_of(&self, identity: &str) -> Result<Vec<TopicRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT t.id, t.owner, t.created_ms, \
             (SELECT COUNT(*) FROM sc_topic_member AS c WHERE c.topic = t.id) AS member_count \
             FROM sc_topic AS t JOIN sc_topic_member AS m ON m.topic = t.id \
             WHERE m.member = $1 ORDER BY t.ord",
        )
        .bind(identity)
        .fetch_all(&self.read)
        .await?)
    }

    async fn topic_for_member(&self, reference: &str, caller: &str) -> Result<Option<TopicRow>, StoreError> {
        Ok(topic_for_member(&self.read, reference, caller).await?)
    }

    async fn roster(&self, topic: &str) -> Result<Vec<IdentityRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT i.id, i.public_key, i.algo, i.display_name, i.key_updated_ms, i.updated_ms, i.created_ms \
             FROM sc_topic_member AS m JOIN sc_identity AS i ON i.id = m.member \
             WHERE m.topic = $1 ORDER BY m.ord",
        )
        .bind(topic)
        .fetch_all(&self.read)
        .await?)
    }

    async fn rendezvous(&self, token_hash: &[u8], now: i64) -> Result<Option<RendezvousRow>, StoreError> {
        let mut conn = self.read.acquire().await?;
        Ok(rendezvous_row(&mut conn, token_hash, now, false).await?)
    }

    async fn counts(&self) -> Result<Counts, StoreError> {
        let (identities, topics, pending, stored): (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM sc_identity), (SELECT COUNT(*) FROM sc_topic), \
             (SELECT COUNT(*) FROM sc_message), \
             (SELECT COALESCE(SUM(value), 0)::BIGINT FROM sc_counter WHERE name = 'messages_stored')",
        )
        .fetch_one(&self.read)
        .await?;
        Ok(Counts::from_raw(identities, topics, pending, stored))
    }
}
