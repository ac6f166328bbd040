//! The ASNET/1 client's rows (issue 18, migration 0012): the account, the commands sent, the
//! replies read (one per response id), challenges held for the owner, invitations, the
//! connection list and warnings. The mailbox password is never here (keystore slot `asnet`).

use sqlx::{Row, SqliteConnection};

use super::{Result, Store};

/// The account row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsnetAccountRow {
    /// The service mailbox.
    pub service: String,
    /// The user's own mailbox.
    pub mailbox: String,
    /// The login for both servers.
    pub username: String,
    /// SMTP host.
    pub smtp_host: String,
    /// SMTP port.
    pub smtp_port: u16,
    /// tls | starttls | none.
    pub smtp_tls: String,
    /// Whether SMTP logs in.
    pub smtp_auth: bool,
    /// IMAP host.
    pub imap_host: String,
    /// IMAP port.
    pub imap_port: u16,
    /// tls | none.
    pub imap_tls: String,
    /// Our member id, once registered.
    pub member_id: String,
    /// Our discovery choice as last registered.
    pub discovery: bool,
    /// The INBOX's UIDVALIDITY when `last_uid` was read.
    pub uid_validity: u32,
    /// Highest UID read.
    pub last_uid: u32,
    /// Last successful read (ms).
    pub last_sync_at: i64,
    /// Last error reading or sending.
    pub last_error: String,
}

/// A challenge row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsnetChallengeRow {
    /// `chl_…`.
    pub challenge_id: String,
    /// The matching request, if any.
    pub request_id: Option<i64>,
    /// The exact action (stored command JSON).
    pub action: String,
    /// The code while pending, else empty.
    pub code: String,
    /// Unix ms.
    pub expires_at: i64,
    /// pending | verified | rejected | expired | warning.
    pub state: String,
}

impl Store {
    /// The account, if set up.
    pub async fn asnet_account(&self) -> Result<Option<AsnetAccountRow>> {
        let row = sqlx::query(
            "SELECT service, mailbox, username, smtp_host, smtp_port, smtp_tls, smtp_auth, imap_host, imap_port, \
             imap_tls, member_id, discovery, uid_validity, last_uid, last_sync_at, last_error FROM asnet_account WHERE id = 1",
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| AsnetAccountRow {
            service: r.get(0),
            mailbox: r.get(1),
            username: r.get(2),
            smtp_host: r.get(3),
            smtp_port: u16::try_from(r.get::<i64, _>(4)).unwrap_or(0),
            smtp_tls: r.get(5),
            smtp_auth: r.get::<i64, _>(6) != 0,
            imap_host: r.get(7),
            imap_port: u16::try_from(r.get::<i64, _>(8)).unwrap_or(0),
            imap_tls: r.get(9),
            member_id: r.get(10),
            discovery: r.get::<i64, _>(11) != 0,
            uid_validity: u32::try_from(r.get::<i64, _>(12)).unwrap_or(0),
            last_uid: u32::try_from(r.get::<i64, _>(13)).unwrap_or(0),
            last_sync_at: r.get(14),
            last_error: r.get(15),
        }))
    }

    /// Creates or replaces the account's settings. A different mailbox or service starts over
    /// (member id and read position are forgotten).
    pub async fn asnet_setup(&self, a: &AsnetAccountRow, now: i64) -> Result<()> {
        let mut tx = self.write_tx().await?;
        let old: Option<(String, String)> =
            sqlx::query_as("SELECT service, mailbox FROM asnet_account WHERE id = 1").fetch_optional(&mut *tx).await?;
        let same = old.as_ref().is_some_and(|(s, m)| *s == a.service && *m == a.mailbox);
        sqlx::query(
            "INSERT INTO asnet_account (id, service, mailbox, username, smtp_host, smtp_port, smtp_tls, smtp_auth, \
             imap_host, imap_port, imap_tls, created_at) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT(id) DO UPDATE SET service = excluded.service, mailbox = excluded.mailbox, \
             username = excluded.username, smtp_host = excluded.smtp_host, smtp_port = excluded.smtp_port, \
             smtp_tls = excluded.smtp_tls, smtp_auth = excluded.smtp_auth, imap_host = excluded.imap_host, \
             imap_port = excluded.imap_port, imap_tls = excluded.imap_tls, last_error = ''",
        )
        .bind(&a.service)
        .bind(&a.mailbox)
        .bind(&a.username)
        .bind(&a.smtp_host)
        .bind(i64::from(a.smtp_port))
        .bind(&a.smtp_tls)
        .bind(i64::from(a.smtp_auth))
        .bind(&a.imap_host)
        .bind(i64::from(a.imap_port))
        .bind(&a.imap_tls)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if !same {
            sqlx::query(
                "UPDATE asnet_account SET member_id = '', discovery = 0, uid_validity = 0, last_uid = 0 WHERE id = 1",
            )
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Records the last error (empty: none) of reading or sending.
    pub async fn asnet_set_error(&self, error: &str) -> Result<()> {
        sqlx::query("UPDATE asnet_account SET last_error = ? WHERE id = 1").bind(error).execute(&self.pool).await?;
        Ok(())
    }

    /// Records a command about to be sent; returns its id.
    pub async fn asnet_request_add(&self, action: &str, requested_by: &str, now: i64) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "INSERT INTO asnet_requests (action, requested_by, created_at, updated_at) VALUES (?, ?, ?, ?) RETURNING id",
        )
        .bind(action)
        .bind(requested_by)
        .bind(now)
        .bind(now)
        .fetch_one(&self.pool)
        .await?)
    }

    /// Forgets a request whose mail could not be sent (nothing can match it).
    pub async fn asnet_request_drop(&self, id: i64) -> Result<()> {
        sqlx::query("DELETE FROM asnet_requests WHERE id = ? AND state = 'sent'").bind(id).execute(&self.pool).await?;
        Ok(())
    }

    /// Requests `(id, action)` still waiting for their challenge, oldest first.
    pub async fn asnet_requests_waiting(conn: &mut SqliteConnection) -> Result<Vec<(i64, String)>> {
        Ok(sqlx::query_as("SELECT id, action FROM asnet_requests WHERE state = 'sent' ORDER BY id")
            .fetch_all(conn)
            .await?)
    }

    /// Requests, newest first (for `status`): `(id, action, requested_by, state, created_at)`.
    pub async fn asnet_requests(&self, limit: i64) -> Result<Vec<(i64, String, String, String, i64)>> {
        Ok(sqlx::query_as(
            "SELECT id, action, requested_by, state, created_at FROM asnet_requests ORDER BY id DESC LIMIT ?",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Remembers a reply's response id; false if it was already read (a duplicate).
    pub async fn asnet_reply_seen(
        conn: &mut SqliteConnection,
        response_id: &str,
        kind: &str,
        body: &str,
        now: i64,
    ) -> Result<bool> {
        let n = sqlx::query(
            "INSERT INTO asnet_replies (response_id, type, body, received_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT(response_id) DO NOTHING",
        )
        .bind(response_id)
        .bind(kind)
        .bind(body)
        .bind(now)
        .execute(conn)
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    /// The most recent stored replies of `kind`, newest first (`(body, received_at)`).
    pub async fn asnet_replies_of(&self, kind: &str, limit: i64) -> Result<Vec<(String, i64)>> {
        Ok(sqlx::query_as(
            "SELECT body, received_at FROM asnet_replies WHERE type = ? ORDER BY received_at DESC, rowid DESC LIMIT ?",
        )
        .bind(kind)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Stores a challenge matched to request `request_id` and queues its review item for the
    /// owner (agent column: who asked). Returns the review id.
    #[allow(clippy::too_many_arguments)]
    pub async fn asnet_challenge_for_review(
        conn: &mut SqliteConnection,
        challenge_id: &str,
        request_id: i64,
        action: &str,
        code: &str,
        expires_at: i64,
        response_id: &str,
        now: i64,
    ) -> Result<i64> {
        sqlx::query(
            "INSERT INTO asnet_challenges (challenge_id, request_id, action, code, expires_at, state, response_id, \
             created_at) VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)",
        )
        .bind(challenge_id)
        .bind(request_id)
        .bind(action)
        .bind(code)
        .bind(expires_at)
        .bind(response_id)
        .bind(now)
        .execute(&mut *conn)
        .await?;
        sqlx::query("UPDATE asnet_requests SET state = 'challenged', updated_at = ? WHERE id = ?")
            .bind(now)
            .bind(request_id)
            .execute(&mut *conn)
            .await?;
        let requested_by: String = sqlx::query_scalar("SELECT requested_by FROM asnet_requests WHERE id = ?")
            .bind(request_id)
            .fetch_one(&mut *conn)
            .await?;
        Ok(sqlx::query_scalar(
            "INSERT INTO review_queue (agent, asnet_challenge, kind, body, created_at) \
             VALUES (?, ?, 'asnet_verify', ?, ?) RETURNING id",
        )
        .bind(requested_by)
        .bind(challenge_id)
        .bind(action)
        .bind(now)
        .fetch_one(&mut *conn)
        .await?)
    }

    /// Records a challenge that will never be answered (no code kept) and its warning.
    pub async fn asnet_challenge_warning(
        conn: &mut SqliteConnection,
        challenge_id: &str,
        action: &str,
        expires_at: i64,
        response_id: &str,
        detail: &str,
        now: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO asnet_challenges (challenge_id, action, expires_at, state, response_id, created_at, decided_at) \
             VALUES (?, ?, ?, 'warning', ?, ?, ?) ON CONFLICT(challenge_id) DO NOTHING",
        )
        .bind(challenge_id)
        .bind(action)
        .bind(expires_at)
        .bind(response_id)
        .bind(now)
        .bind(now)
        .execute(&mut *conn)
        .await?;
        Self::asnet_warn(conn, "unsolicited_challenge", detail, now).await
    }

    /// Records a warning.
    pub async fn asnet_warn(conn: &mut SqliteConnection, kind: &str, detail: &str, now: i64) -> Result<()> {
        sqlx::query("INSERT INTO asnet_warnings (kind, detail, created_at) VALUES (?, ?, ?)")
            .bind(kind)
            .bind(detail)
            .bind(now)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Warnings, newest first: `(id, kind, detail, created_at)`.
    pub async fn asnet_warnings(&self, limit: i64) -> Result<Vec<(i64, String, String, i64)>> {
        Ok(sqlx::query_as("SELECT id, kind, detail, created_at FROM asnet_warnings ORDER BY id DESC LIMIT ?")
            .bind(limit)
            .fetch_all(&self.pool)
            .await?)
    }

    /// The pending challenge behind review item `review_id`, if it is an ASNET one.
    pub async fn asnet_challenge_of_review(&self, review_id: i64) -> Result<Option<AsnetChallengeRow>> {
        let row = sqlx::query(
            "SELECT c.challenge_id, c.request_id, c.action, c.code, c.expires_at, c.state FROM review_queue r \
             JOIN asnet_challenges c ON c.challenge_id = r.asnet_challenge WHERE r.id = ? AND r.state = 'pending'",
        )
        .bind(review_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| AsnetChallengeRow {
            challenge_id: r.get(0),
            request_id: r.get(1),
            action: r.get(2),
            code: r.get(3),
            expires_at: r.get(4),
            state: r.get(5),
        }))
    }

    /// Decides a challenge's review: the code is emptied, the challenge, its request and the
    /// review row move to their final states together.
    pub async fn asnet_challenge_decide(
        &self,
        review_id: i64,
        challenge_id: &str,
        approved: bool,
        now: i64,
    ) -> Result<()> {
        let mut tx = self.write_tx().await?;
        let (challenge_state, request_state, review_state) =
            if approved { ("verified", "verified", "approved") } else { ("rejected", "rejected", "rejected") };
        sqlx::query("UPDATE asnet_challenges SET code = '', state = ?, decided_at = ? WHERE challenge_id = ?")
            .bind(challenge_state)
            .bind(now)
            .bind(challenge_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE asnet_requests SET state = ?, updated_at = ? \
             WHERE id = (SELECT request_id FROM asnet_challenges WHERE challenge_id = ?)",
        )
        .bind(request_state)
        .bind(now)
        .bind(challenge_id)
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE review_queue SET state = ?, decided_at = ? WHERE id = ? AND state = 'pending'")
            .bind(review_state)
            .bind(now)
            .bind(review_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Empties the codes of challenges past their expiry and closes their review items.
    pub async fn asnet_expire_challenges(&self, now: i64) -> Result<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query(
            "UPDATE review_queue SET state = 'rejected', decided_at = ? WHERE state = 'pending' AND asnet_challenge IN \
             (SELECT challenge_id FROM asnet_challenges WHERE state = 'pending' AND expires_at <= ?)",
        )
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE asnet_challenges SET code = '', state = 'expired', decided_at = ? WHERE state = 'pending' AND expires_at <= ?",
        )
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Challenges, newest first, without codes: `(challenge_id, action, state, expires_at)`.
    pub async fn asnet_challenges(&self, limit: i64) -> Result<Vec<(String, String, String, i64)>> {
        Ok(sqlx::query_as(
            "SELECT challenge_id, action, state, expires_at FROM asnet_challenges ORDER BY created_at DESC, rowid DESC LIMIT ?",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Records what REGISTERED said.
    pub async fn asnet_registered(conn: &mut SqliteConnection, member_id: &str, discovery: bool) -> Result<()> {
        sqlx::query("UPDATE asnet_account SET member_id = ?, discovery = ? WHERE id = 1")
            .bind(member_id)
            .bind(i64::from(discovery))
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Records an invitation (a repeat keeps its state).
    pub async fn asnet_invitation(
        conn: &mut SqliteConnection,
        request_id: &str,
        from_member: &str,
        scopes: &str,
        expires_at: i64,
        now: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO asnet_invitations (request_id, from_member, scopes, expires_at, received_at) VALUES (?, ?, ?, ?, ?) \
             ON CONFLICT(request_id) DO NOTHING",
        )
        .bind(request_id)
        .bind(from_member)
        .bind(scopes)
        .bind(expires_at)
        .bind(now)
        .execute(conn)
        .await?;
        Ok(())
    }

    /// An invitation: `(from_member, scopes, expires_at, state)`.
    pub async fn asnet_invitation_get(&self, request_id: &str) -> Result<Option<(String, String, i64, String)>> {
        Ok(sqlx::query_as("SELECT from_member, scopes, expires_at, state FROM asnet_invitations WHERE request_id = ?")
            .bind(request_id)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Moves an invitation to `state`.
    pub async fn asnet_invitation_state(conn: &mut SqliteConnection, request_id: &str, state: &str) -> Result<()> {
        sqlx::query("UPDATE asnet_invitations SET state = ? WHERE request_id = ?")
            .bind(state)
            .bind(request_id)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Invitations not yet accepted and not expired: `(request_id, from_member, scopes, expires_at, state)`.
    pub async fn asnet_invitations_open(&self, now: i64) -> Result<Vec<(String, String, String, i64, String)>> {
        Ok(sqlx::query_as(
            "SELECT request_id, from_member, scopes, expires_at, state FROM asnet_invitations \
             WHERE state != 'accepted' AND expires_at > ? ORDER BY received_at",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Adds or updates one connection.
    pub async fn asnet_connection_put(
        conn: &mut SqliteConnection,
        member_id: &str,
        scopes: &str,
        now: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO asnet_connections (member_id, scopes, updated_at) VALUES (?, ?, ?) \
             ON CONFLICT(member_id) DO UPDATE SET scopes = excluded.scopes, updated_at = excluded.updated_at",
        )
        .bind(member_id)
        .bind(scopes)
        .bind(now)
        .execute(conn)
        .await?;
        Ok(())
    }

    /// Removes one connection.
    pub async fn asnet_connection_delete(conn: &mut SqliteConnection, member_id: &str) -> Result<()> {
        sqlx::query("DELETE FROM asnet_connections WHERE member_id = ?").bind(member_id).execute(conn).await?;
        Ok(())
    }

    /// Replaces the whole list (a CONNECTIONS reply).
    pub async fn asnet_connections_replace(
        conn: &mut SqliteConnection,
        list: &[(String, String)],
        now: i64,
    ) -> Result<()> {
        sqlx::query("DELETE FROM asnet_connections").execute(&mut *conn).await?;
        for (member, scopes) in list {
            Self::asnet_connection_put(conn, member, scopes, now).await?;
        }
        Ok(())
    }

    /// The connection list: `(member_id, scopes, updated_at)`.
    pub async fn asnet_connections(&self) -> Result<Vec<(String, String, i64)>> {
        Ok(sqlx::query_as("SELECT member_id, scopes, updated_at FROM asnet_connections ORDER BY member_id")
            .fetch_all(&self.pool)
            .await?)
    }

    /// Moves the read position (and records a successful read).
    pub async fn asnet_read_position(
        conn: &mut SqliteConnection,
        uid_validity: u32,
        last_uid: u32,
        now: i64,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE asnet_account SET uid_validity = ?, last_uid = ?, last_sync_at = ?, last_error = '' WHERE id = 1",
        )
        .bind(i64::from(uid_validity))
        .bind(i64::from(last_uid))
        .bind(now)
        .execute(conn)
        .await?;
        Ok(())
    }
}
