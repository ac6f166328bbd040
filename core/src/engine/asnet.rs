//! The engine's ASNET/1 client (issue 18): one account per profile, commands out by SMTP from the
//! user's own mailbox, service replies in by IMAP from the same mailbox, and the owner in the
//! loop for every challenge.
//!
//! - Sending: a protected command is recorded (`asnet_requests`, the exact action) before its
//!   plain-text mail goes to the service through the account's SMTP server (lettre, rustls);
//!   a mail that could not be sent leaves no request behind.
//! - Reading: the INBOX is read by UID from where the last read stopped (a new UIDVALIDITY starts
//!   over); each mail goes through the sans-io `client::read_reply` (From must be the service,
//!   `X-ASNET-Response-ID` must match, strict body). Refused mail and duplicate response ids are
//!   recorded as warnings; nothing is deleted or flagged in the mailbox, so nothing is lost.
//! - Challenges: `client::judge_challenge` matches the action against the requests still waiting;
//!   a match becomes a review item (`review list`, kind `asnet_verify`, its text the exact
//!   action); anything else is a warning and is never answered. `VERIFY` is sent only by
//!   `review approve`, and only while the challenge is unexpired and its request still matches.
//! - Not a [`super::channels::Channel`]: ASNET has no contacts or messages to seal; it is a
//!   request/challenge exchange with one service.
//! - A running runtime reads the mailbox when IMAP IDLE reports new mail (RFC 2177; each IDLE
//!   lasts a minute at most), or every 15 s where the server offers no IDLE;
//!   a one-shot CLI reads it on `asnet status`.

use std::net::IpAddr;
use std::time::Duration;

use futures_util::TryStreamExt as _;
use lettre::address::Envelope;
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport as _, Tokio1Executor};
use serde_json::{Value, json};
use zeroize::Zeroizing;

use super::{Error, Result, Runtime, blocking};
use crate::api::Request;
use crate::protocol::asnet::client::{
    AskedFor, ChallengeVerdict, ReplyIn, judge_challenge, read_reply, render_command,
};
use crate::protocol::asnet::{Action, Command, Mailbox, MemberId, ReplyBody, RequestId, Scope, Scopes};
use crate::store::{AsnetAccountRow, Store};
use crate::util::{hex, now_ms, random_array};

/// How often a running runtime reads the mailbox (`SWITCHBOARD_ASNET_POLL_MS` overrides).
const POLL: Duration = Duration::from_secs(15);
/// How long one IMAP IDLE lasts before the mailbox is read anyway (well under the 29 minutes
/// RFC 2177 allows; it also bounds the wait for mail that slipped in as IDLE started).
const IDLE_FOR: Duration = Duration::from_secs(60);
/// Who asked for a command the owner made (review items name the agent otherwise).
const OWNER: &str = "owner";
/// How long one SMTP or IMAP exchange may take.
const NET_TIMEOUT: Duration = Duration::from_secs(30);
/// Most mails read in one pass.
const MAX_FETCH: u32 = 200;

/// The account with its parsed addresses and the password from the keystore.
struct Account {
    row: AsnetAccountRow,
    service: Mailbox,
    mailbox: Mailbox,
    password: Zeroizing<String>,
}

fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn host_port(text: &str, what: &str) -> Result<(String, u16)> {
    let (host, port) =
        text.rsplit_once(':').ok_or_else(|| Error::Invalid(format!("{what} must be HOST:PORT, got `{text}`")))?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let port = port.parse::<u16>().ok().filter(|p| *p != 0);
    match port {
        Some(port) if !host.is_empty() => Ok((host.to_owned(), port)),
        _ => Err(Error::Invalid(format!("{what} must be HOST:PORT, got `{text}`"))),
    }
}

fn mail_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::MailServer(format!("{what}: {e}"))
}

fn parse_scopes(names: &[String]) -> Result<Scopes> {
    let scopes = names
        .iter()
        .flat_map(|n| n.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| {
            Scope::parse(n).map_err(|_| Error::Invalid(format!("unknown scope `{n}` (contact:email, profile:basic)")))
        })
        .collect::<Result<Vec<_>>>()?;
    Scopes::new(scopes).ok_or_else(|| Error::Invalid("scopes must be a nonempty set of distinct scopes".into()))
}

fn member(text: &str) -> Result<MemberId> {
    MemberId::parse(text).map_err(|_| Error::Invalid(format!("`{text}` is not a member id (mem_ + 32 hex)")))
}

fn action_json(stored: &str) -> Value {
    serde_json::from_str(stored).unwrap_or(Value::String(stored.to_owned()))
}

impl Runtime {
    /// Handles an `asnet_*` request of the owner (`agent` `None`) or of an agent session (the MCP
    /// tools; `Caller::admit` let through only lookups, the status and connect, accept,
    /// disconnect and the connection list). An agent's protected command goes out as the
    /// agent's, and the service acts on it only after VERIFY, which this runtime sends only when
    /// the owner approves the challenge in the review queue (the item names the agent).
    pub(super) async fn asnet_request(&self, agent: Option<&str>, req: Request) -> Result<Value> {
        match agent {
            None => self.asnet_request_as(req, OWNER).await,
            // The owner's name in the requests table is not an agent's to take.
            Some(OWNER) => Err(Error::Forbidden("an agent named `owner` may not use the ASNET account".into())),
            Some(me) => self.asnet_request_as(req, me).await,
        }
    }

    async fn asnet_request_as(&self, req: Request, by: &str) -> Result<Value> {
        match req {
            Request::AsnetSetup { service, mailbox, username, password, smtp, smtp_tls, smtp_auth, imap, imap_tls } => {
                self.asnet_setup(AsnetSetup {
                    service,
                    mailbox,
                    username,
                    password: Zeroizing::new(password.0),
                    smtp,
                    smtp_tls,
                    smtp_auth,
                    imap,
                    imap_tls,
                })
                .await
            }
            Request::AsnetRegister { discovery } => self.asnet_ask(Action::Register { discovery }, by).await,
            Request::AsnetLookup { member_id } => {
                let member_id = member(&member_id)?;
                let acct = self.asnet_account().await?;
                self.asnet_send(&acct, &Command::Lookup { member_id }).await?;
                Ok(json!({"sent": "LOOKUP", "member_id": member_id.to_string()}))
            }
            Request::AsnetConnect { member_id, scopes } => {
                let action = Action::Connect { member_id: member(&member_id)?, scopes: parse_scopes(&scopes)? };
                self.asnet_ask(action, by).await
            }
            Request::AsnetAccept { request_id, scopes } => self.asnet_accept(&request_id, &scopes, by).await,
            Request::AsnetConnections => {
                let mut v = self.asnet_ask(Action::ListConnections, by).await?;
                if let Some(o) = v.as_object_mut() {
                    o.insert("connections".into(), self.asnet_connections_dto().await?);
                }
                Ok(v)
            }
            Request::AsnetDisconnect { member_id } => {
                self.asnet_ask(Action::Disconnect { member_id: member(&member_id)? }, by).await
            }
            Request::AsnetStatus => self.asnet_status().await,
            _ => Err(Error::Bug("not an asnet request".into())),
        }
    }

    async fn asnet_setup(&self, s: AsnetSetup) -> Result<Value> {
        let service = Mailbox::parse(s.service.trim())
            .map_err(|_| Error::Invalid(format!("`{}` is not a bare mailbox", s.service)))?;
        let mailbox = Mailbox::parse(s.mailbox.trim())
            .map_err(|_| Error::Invalid(format!("`{}` is not a bare mailbox", s.mailbox)))?;
        if service == mailbox {
            return Err(Error::Invalid("your mailbox cannot be the service mailbox".into()));
        }
        let (smtp_host, smtp_port) = host_port(&s.smtp, "--smtp")?;
        let (imap_host, imap_port) = host_port(&s.imap, "--imap")?;
        let smtp_tls = s.smtp_tls.unwrap_or_else(|| "tls".into());
        let imap_tls = s.imap_tls.unwrap_or_else(|| "tls".into());
        if !matches!(smtp_tls.as_str(), "tls" | "starttls" | "none") {
            return Err(Error::Invalid("--smtp-tls must be tls, starttls or none".into()));
        }
        if !matches!(imap_tls.as_str(), "tls" | "none") {
            return Err(Error::Invalid("--imap-tls must be tls or none".into()));
        }
        // A password in clear text may cross only the loopback interface.
        if smtp_tls == "none" && !is_loopback_host(&smtp_host) {
            return Err(Error::Invalid("--smtp-tls none is allowed for a loopback server only".into()));
        }
        if imap_tls == "none" && !is_loopback_host(&imap_host) {
            return Err(Error::Invalid("--imap-tls none is allowed for a loopback server only".into()));
        }
        if s.password.is_empty() {
            return Err(Error::Invalid("the mailbox password is empty".into()));
        }
        let username = s.username.filter(|u| !u.trim().is_empty()).unwrap_or_else(|| mailbox.to_string());
        let ks = self.inner.keys.slot("asnet")?;
        let pw = s.password.clone();
        blocking(move || ks.save(pw.as_bytes())).await??;
        let row = AsnetAccountRow {
            service: service.to_string(),
            mailbox: mailbox.to_string(),
            username,
            smtp_host,
            smtp_port,
            smtp_tls,
            smtp_auth: s.smtp_auth.unwrap_or(true),
            imap_host,
            imap_port,
            imap_tls,
            member_id: String::new(),
            discovery: false,
            uid_validity: 0,
            last_uid: 0,
            last_sync_at: 0,
            last_error: String::new(),
        };
        self.store().asnet_setup(&row, now_ms()).await?;
        self.asnet_status_local().await
    }

    async fn asnet_account(&self) -> Result<Account> {
        let row = self.store().asnet_account().await?.ok_or(Error::AsnetNotSetUp)?;
        let service = Mailbox::parse(&row.service).map_err(|_| Error::Bug("stored service mailbox".into()))?;
        let mailbox = Mailbox::parse(&row.mailbox).map_err(|_| Error::Bug("stored mailbox".into()))?;
        let ks = self.inner.keys.slot("asnet")?;
        let secret = blocking(move || ks.load()).await??.ok_or(Error::AsnetNotSetUp)?;
        let password = Zeroizing::new(
            String::from_utf8(secret.to_vec())
                .map_err(|_| Error::Keystore(crate::identity::keystore::KeystoreError::Corrupt))?,
        );
        Ok(Account { row, service, mailbox, password })
    }

    /// Sends one command mail from the user's mailbox to the service.
    async fn asnet_send(&self, acct: &Account, command: &Command) -> Result<()> {
        let host = acct.row.smtp_host.as_str();
        let builder = match acct.row.smtp_tls.as_str() {
            "tls" => AsyncSmtpTransport::<Tokio1Executor>::relay(host).map_err(|e| mail_err("SMTP", e))?,
            "starttls" => {
                AsyncSmtpTransport::<Tokio1Executor>::starttls_relay(host).map_err(|e| mail_err("SMTP", e))?
            }
            _ => AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host),
        };
        let mut builder = builder.port(acct.row.smtp_port).timeout(Some(NET_TIMEOUT));
        if acct.row.smtp_auth {
            builder = builder.credentials(Credentials::new(acct.row.username.clone(), acct.password.to_string()));
        }
        let transport = builder.build();
        let from = acct.mailbox.as_str().parse::<lettre::Address>().map_err(|e| mail_err("own mailbox", e))?;
        let to = acct.service.as_str().parse::<lettre::Address>().map_err(|e| mail_err("service mailbox", e))?;
        let envelope = Envelope::new(Some(from), vec![to]).map_err(|e| mail_err("envelope", e))?;
        let raw = render_command(command, &acct.mailbox, &acct.service, now_ms(), &hex(&random_array::<16>()));
        let sent = transport.send_raw(&envelope, &raw).await;
        match sent {
            Ok(_) => Ok(()),
            Err(e) => {
                let err = mail_err("SMTP send", e);
                let _ = self.store().asnet_set_error(&err.to_string()).await;
                Err(err)
            }
        }
    }

    /// Records a protected command as asked for by `requested_by`, then sends it.
    async fn asnet_ask(&self, action: Action, requested_by: &str) -> Result<Value> {
        let acct = self.asnet_account().await?;
        let stored = action.to_stored();
        let id = self.store().asnet_request_add(&stored, requested_by, now_ms()).await?;
        if let Err(e) = self.asnet_send(&acct, &Command::Protected(action)).await {
            self.store().asnet_request_drop(id).await?;
            return Err(e);
        }
        Ok(json!({
            "sent": true,
            "request": id,
            "action": action_json(&stored),
            "next": "the service answers with a challenge; it shows in `switchboard review list` for your approval",
        }))
    }

    async fn asnet_accept(&self, request_id: &str, scopes: &[String], by: &str) -> Result<Value> {
        let rid = RequestId::parse(request_id)
            .map_err(|_| Error::Invalid(format!("`{request_id}` is not a request id (req_ + 32 hex)")))?;
        let scopes = parse_scopes(scopes)?;
        let (_, offered, expires_at, state) = self
            .store()
            .asnet_invitation_get(request_id)
            .await?
            .ok_or_else(|| Error::Invalid(format!("no invitation {request_id} has arrived")))?;
        if state == "accepted" {
            return Err(Error::Invalid(format!("invitation {request_id} is already accepted")));
        }
        if expires_at <= now_ms() {
            return Err(Error::Invalid(format!("invitation {request_id} has expired")));
        }
        let offered = Scopes::from_csv(&offered).ok_or_else(|| Error::Bug("stored scopes".into()))?;
        if !scopes.is_subset_of(&offered) {
            return Err(Error::Invalid(format!(
                "the invitation offers only {}: accept the same or fewer scopes",
                offered.names().join(", ")
            )));
        }
        let v = self.asnet_ask(Action::Accept { request_id: rid, scopes }, by).await?;
        let mut conn = self.store().pool.acquire().await?;
        Store::asnet_invitation_state(&mut conn, request_id, "accepting").await?;
        Ok(v)
    }

    /// Reads new mail once and processes it. Returns how many service replies were taken.
    pub(super) async fn asnet_sync(&self) -> Result<usize> {
        let acct = self.asnet_account().await?;
        self.store().asnet_expire_challenges(now_ms()).await?;
        let fetched = match tokio::time::timeout(NET_TIMEOUT, self.asnet_fetch(&acct)).await {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => {
                let _ = self.store().asnet_set_error(&e.to_string()).await;
                return Err(e);
            }
            Err(_) => {
                let e = Error::MailServer("IMAP timed out".into());
                let _ = self.store().asnet_set_error(&e.to_string()).await;
                return Err(e);
            }
        };
        let mut taken = 0;
        let mut last_uid = if fetched.uid_validity == acct.row.uid_validity { acct.row.last_uid } else { 0 };
        for (uid, raw) in fetched.mails {
            if uid <= last_uid {
                continue;
            }
            let now = now_ms();
            let mut tx = self.store().write_tx().await?;
            match read_reply(&raw, &acct.service) {
                Ok(reply) => {
                    if self.asnet_take(&mut tx, reply, uid, now).await? {
                        taken += 1;
                    }
                }
                Err(e) => {
                    Store::asnet_warn(&mut tx, "refused_mail", &format!("IMAP UID {uid}: {e}"), now).await?;
                }
            }
            Store::asnet_read_position(&mut tx, fetched.uid_validity, uid, now).await?;
            tx.commit().await?;
            last_uid = uid;
        }
        if last_uid == acct.row.last_uid && fetched.uid_validity == acct.row.uid_validity {
            let mut conn = self.store().pool.acquire().await?;
            Store::asnet_read_position(&mut conn, fetched.uid_validity, last_uid, now_ms()).await?;
        }
        Ok(taken)
    }

    /// One checked reply inside the caller's transaction; false for a duplicate response id.
    async fn asnet_take(&self, tx: &mut sqlx::SqliteConnection, reply: ReplyIn, uid: u32, now: i64) -> Result<bool> {
        let rid = reply.response_id.to_string();
        // The stored copy never keeps a challenge code.
        let mut stored = crate::protocol::asnet::Reply {
            response_id: reply.response_id,
            to: Mailbox::parse("stored@invalid").map_err(|_| Error::Bug("placeholder mailbox".into()))?,
            body: reply.body.clone(),
            created_at: now,
            expires_at: now,
        }
        .to_json();
        if let Some(o) = stored.as_object_mut()
            && o.contains_key("code")
        {
            o.insert("code".into(), Value::String(String::new()));
        }
        if !Store::asnet_reply_seen(tx, &rid, reply.body.type_name(), &stored.to_string(), now).await? {
            Store::asnet_warn(
                tx,
                "duplicate_response",
                &format!("IMAP UID {uid}: response {rid} was already read"),
                now,
            )
            .await?;
            return Ok(false);
        }
        match reply.body {
            ReplyBody::Challenge { challenge_id, code, expires_at, action } => {
                let asked: Vec<AskedFor<i64>> = Store::asnet_requests_waiting(tx)
                    .await?
                    .into_iter()
                    .filter_map(|(id, a)| Action::from_stored(&a).map(|action| AskedFor { key: id, action }))
                    .collect();
                let cid = challenge_id.to_string();
                let stored_action = action.to_stored();
                match judge_challenge(&asked, &action) {
                    ChallengeVerdict::AskOwner { key } => {
                        let review = Store::asnet_challenge_for_review(
                            tx,
                            &cid,
                            key,
                            &stored_action,
                            &code.to_string(),
                            expires_at,
                            &rid,
                            now,
                        )
                        .await?;
                        tracing::info!(review, "asnet: a challenge waits for the owner's approval");
                    }
                    ChallengeVerdict::Unsolicited => {
                        let detail = format!(
                            "challenge {cid} for {stored_action} matches nothing this profile asked for: never answered"
                        );
                        Store::asnet_challenge_warning(tx, &cid, &stored_action, expires_at, &rid, &detail, now)
                            .await?;
                    }
                }
            }
            ReplyBody::Registered { member_id, discovery } => {
                Store::asnet_registered(tx, &member_id.to_string(), discovery).await?;
            }
            ReplyBody::Invitation { request_id, from_member_id, scopes, expires_at } => {
                Store::asnet_invitation(
                    tx,
                    &request_id.to_string(),
                    &from_member_id.to_string(),
                    &scopes.to_csv(),
                    expires_at,
                    now,
                )
                .await?;
            }
            ReplyBody::Connected { request_id, member_id, scopes } => {
                Store::asnet_connection_put(tx, &member_id.to_string(), &scopes.to_csv(), now).await?;
                Store::asnet_invitation_state(tx, &request_id.to_string(), "accepted").await?;
            }
            ReplyBody::Connections { connections } => {
                let list: Vec<(String, String)> =
                    connections.iter().map(|(m, s)| (m.to_string(), s.to_csv())).collect();
                Store::asnet_connections_replace(tx, &list, now).await?;
            }
            ReplyBody::Disconnected { member_id } => {
                Store::asnet_connection_delete(tx, &member_id.to_string()).await?;
            }
            // Kept in `asnet_replies` and shown by `status`.
            ReplyBody::Lookup { .. } | ReplyBody::ConnectionRequested { .. } => {}
        }
        Ok(true)
    }

    /// Fetches mail above the last read UID (all of it after a UIDVALIDITY change).
    async fn asnet_fetch(&self, acct: &Account) -> Result<Fetched> {
        imap_fetch(imap_login(acct).await?, acct).await
    }

    /// Waits up to `limit` for new mail with IMAP IDLE (RFC 2177). `Ok(true)`: the server said
    /// something changed; `Ok(false)`: the limit passed, or the server does not offer IDLE (the
    /// caller then polls).
    async fn asnet_idle(&self, limit: Duration) -> Result<bool> {
        let acct = self.asnet_account().await?;
        let mut session = imap_login(&acct).await?;
        let capabilities = session.capabilities().await.map_err(|e| mail_err("IMAP CAPABILITY", e))?;
        if !capabilities.has_str("IDLE") {
            let _ = session.logout().await;
            return Ok(false);
        }
        // Mail that lands between the last read and this IDLE wakes nothing: IDLE_FOR bounds that
        // wait. (Comparing UIDNEXT with the last read UID would not do: a message expunged
        // before it was read keeps UIDNEXT ahead forever and would spin this loop.)
        session.select("INBOX").await.map_err(|e| mail_err("IMAP SELECT INBOX", e))?;
        let mut idle = session.idle();
        idle.init().await.map_err(|e| mail_err("IMAP IDLE", e))?;
        let (wait, _interrupt) = idle.wait_with_timeout(limit);
        let woke = wait.await.map_err(|e| mail_err("IMAP IDLE", e))?;
        let new_data = matches!(woke, async_imap::extensions::idle::IdleResponse::NewData(_));
        if let Ok(mut session) = idle.done().await {
            let _ = session.logout().await;
        }
        Ok(new_data)
    }

    /// Approves the ASNET challenge behind review item `review_id` (the caller found it
    /// pending): re-checks the rule, sends `VERIFY`, then records the decision.
    pub(super) async fn asnet_approve(&self, review_id: i64, ch: crate::store::AsnetChallengeRow) -> Result<Value> {
        let now = now_ms();
        if ch.state != "pending" || ch.code.is_empty() {
            return Err(Error::Invalid(format!("review {review_id}: the challenge is no longer pending")));
        }
        if ch.expires_at <= now {
            self.store().asnet_expire_challenges(now).await?;
            return Err(Error::Invalid(format!("review {review_id}: the challenge expired; ask again")));
        }
        // The rule again, at the moment of sending: the stored request must still carry exactly
        // this action (a challenge without a request never reaches the review queue).
        let request_action = match ch.request_id {
            Some(id) => self.store().asnet_requests(1000).await?.into_iter().find(|r| r.0 == id).map(|r| r.1),
            None => None,
        };
        let action = Action::from_stored(&ch.action).ok_or_else(|| Error::Bug("stored challenge action".into()))?;
        let asked: Vec<AskedFor<i64>> = request_action
            .as_deref()
            .and_then(Action::from_stored)
            .map(|a| vec![AskedFor { key: 0, action: a }])
            .unwrap_or_default();
        if judge_challenge(&asked, &action) == ChallengeVerdict::Unsolicited {
            return Err(Error::Bug("a review item's challenge does not match its request".into()));
        }
        let challenge_id = crate::protocol::asnet::ChallengeId::parse(&ch.challenge_id)
            .map_err(|_| Error::Bug("stored challenge id".into()))?;
        let code =
            crate::protocol::asnet::Code::parse(&ch.code).map_err(|_| Error::Bug("stored challenge code".into()))?;
        let acct = self.asnet_account().await?;
        self.asnet_send(&acct, &Command::Verify { challenge_id, code }).await?;
        self.store().asnet_challenge_decide(review_id, &ch.challenge_id, true, now_ms()).await?;
        Ok(json!({
            "review_id": review_id,
            "state": "approved",
            "sent": "VERIFY",
            "challenge_id": ch.challenge_id,
            "action": action_json(&ch.action),
        }))
    }

    /// Rejects the ASNET challenge behind review item `review_id`: never answered, code dropped.
    pub(super) async fn asnet_reject(&self, review_id: i64, ch: crate::store::AsnetChallengeRow) -> Result<Value> {
        self.store().asnet_challenge_decide(review_id, &ch.challenge_id, false, now_ms()).await?;
        Ok(json!({"review_id": review_id, "state": "rejected", "challenge_id": ch.challenge_id}))
    }

    async fn asnet_connections_dto(&self) -> Result<Value> {
        Ok(Value::Array(
            self.store()
                .asnet_connections()
                .await?
                .into_iter()
                .map(|(m, s, at)| json!({"member_id": m, "scopes": s.split(',').collect::<Vec<_>>(), "updated_at": at}))
                .collect(),
        ))
    }

    async fn asnet_status(&self) -> Result<Value> {
        let sync_error = match self.asnet_sync().await {
            Ok(_) => None,
            Err(Error::AsnetNotSetUp) => return Err(Error::AsnetNotSetUp),
            Err(e) => Some(e.to_string()),
        };
        let mut v = self.asnet_status_local().await?;
        if let (Some(o), Some(e)) = (v.as_object_mut(), sync_error) {
            o.insert("sync_error".into(), Value::String(e));
        }
        Ok(v)
    }

    async fn asnet_status_local(&self) -> Result<Value> {
        let store = self.store();
        let a = store.asnet_account().await?.ok_or(Error::AsnetNotSetUp)?;
        let requests: Vec<Value> = store
            .asnet_requests(20)
            .await?
            .into_iter()
            .map(|(id, action, by, state, at)| {
                json!({"id": id, "action": action_json(&action), "requested_by": by, "state": state, "created_at": at})
            })
            .collect();
        let challenges: Vec<Value> = store
            .asnet_challenges(20)
            .await?
            .into_iter()
            .map(|(id, action, state, exp)| {
                json!({"challenge_id": id, "action": action_json(&action), "state": state, "expires_at": exp})
            })
            .collect();
        let invitations: Vec<Value> = store
            .asnet_invitations_open(now_ms())
            .await?
            .into_iter()
            .map(|(rid, from, scopes, exp, state)| {
                json!({"request_id": rid, "from_member_id": from, "scopes": scopes.split(',').collect::<Vec<_>>(),
                       "expires_at": exp, "state": state})
            })
            .collect();
        let lookups: Vec<Value> =
            store.asnet_replies_of("LOOKUP", 10).await?.into_iter().map(|(body, _)| action_json(&body)).collect();
        let warnings: Vec<Value> = store
            .asnet_warnings(20)
            .await?
            .into_iter()
            .map(|(id, kind, detail, at)| json!({"id": id, "kind": kind, "detail": detail, "created_at": at}))
            .collect();
        Ok(json!({
            "service": a.service,
            "mailbox": a.mailbox,
            "smtp": format!("{}:{} ({})", a.smtp_host, a.smtp_port, a.smtp_tls),
            "imap": format!("{}:{} ({})", a.imap_host, a.imap_port, a.imap_tls),
            "member_id": if a.member_id.is_empty() { Value::Null } else { Value::String(a.member_id.clone()) },
            "discovery": a.discovery,
            "last_sync_at": a.last_sync_at,
            "last_error": a.last_error,
            "requests": requests,
            "challenges": challenges,
            "invitations": invitations,
            "connections": self.asnet_connections_dto().await?,
            "lookups": lookups,
            "warnings": warnings,
        }))
    }

    /// A running runtime's mailbox reader.
    pub(super) async fn asnet_loop(self) {
        let every = std::env::var("SWITCHBOARD_ASNET_POLL_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(POLL, |ms| Duration::from_millis(ms.max(100)));
        let mut stop = self.inner.shutdown.subscribe();
        loop {
            let read = match self.asnet_sync().await {
                Ok(_) => true,
                Err(Error::AsnetNotSetUp) => false,
                Err(e) => {
                    tracing::warn!("asnet: reading the mailbox: {e}");
                    false
                }
            };
            // The next read: as soon as the server reports new mail where it offers IDLE, else
            // (after a failed read, or an IDLE failure) at the poll interval.
            let next = async {
                if !read {
                    tokio::time::sleep(every).await;
                    return;
                }
                match self.asnet_idle(IDLE_FOR).await {
                    Ok(true) => {}
                    Ok(false) => tokio::time::sleep(every).await,
                    Err(Error::AsnetNotSetUp) => tokio::time::sleep(every).await,
                    Err(e) => {
                        tracing::debug!("asnet: IMAP IDLE: {e}");
                        tokio::time::sleep(every).await;
                    }
                }
            };
            tokio::select! {
                () = next => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// The `asnet_setup` request's fields.
struct AsnetSetup {
    service: String,
    mailbox: String,
    username: Option<String>,
    password: Zeroizing<String>,
    smtp: String,
    smtp_tls: Option<String>,
    smtp_auth: Option<bool>,
    imap: String,
    imap_tls: Option<String>,
}

/// What one IMAP pass read.
struct Fetched {
    uid_validity: u32,
    /// `(uid, raw)`, ascending.
    mails: Vec<(u32, Vec<u8>)>,
}

/// The IMAP connection, plain (loopback only) or TLS.
trait ImapStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + std::fmt::Debug + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + std::fmt::Debug + Send> ImapStream for T {}

type ImapSession = async_imap::Session<Box<dyn ImapStream>>;

/// Connects to the account's IMAP server, reads its greeting and logs in.
async fn imap_login(acct: &Account) -> Result<ImapSession> {
    let addr = (acct.row.imap_host.as_str(), acct.row.imap_port);
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| mail_err("IMAP connect", e))?;
    let stream: Box<dyn ImapStream> = if acct.row.imap_tls == "tls" {
        let config = crate::transport::tls::client_config(None).map_err(|e| mail_err("TLS", e))?;
        let name = rustls::pki_types::ServerName::try_from(acct.row.imap_host.clone())
            .map_err(|e| mail_err("IMAP host name", e))?;
        let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| mail_err("IMAP TLS", e))?;
        Box::new(tls)
    } else {
        Box::new(tcp)
    };
    let mut client = async_imap::Client::new(stream);
    client
        .read_response()
        .await
        .map_err(|e| mail_err("IMAP greeting", e))?
        .ok_or_else(|| Error::MailServer("IMAP: the server closed before its greeting".into()))?;
    client.login(&acct.row.username, acct.password.as_str()).await.map_err(|(e, _)| mail_err("IMAP login", e))
}

async fn imap_fetch(mut session: ImapSession, acct: &Account) -> Result<Fetched> {
    let mailbox = session.select("INBOX").await.map_err(|e| mail_err("IMAP SELECT INBOX", e))?;
    let uid_validity = mailbox.uid_validity.unwrap_or(0);
    let from = if uid_validity == acct.row.uid_validity { acct.row.last_uid.saturating_add(1) } else { 1 };
    let mut mails = Vec::new();
    if mailbox.exists > 0 {
        let range = format!("{from}:*");
        let stream = session.uid_fetch(&range, "(UID BODY.PEEK[])").await.map_err(|e| mail_err("IMAP FETCH", e))?;
        let fetches: Vec<_> = stream.try_collect().await.map_err(|e| mail_err("IMAP FETCH", e))?;
        for f in fetches {
            // `n:*` names the last message even when its UID is below n.
            if let (Some(uid), Some(body)) = (f.uid, f.body())
                && uid >= from
            {
                mails.push((uid, body.to_vec()));
            }
        }
    }
    mails.sort_by_key(|(uid, _)| *uid);
    mails.truncate(usize::try_from(MAX_FETCH).unwrap_or(usize::MAX));
    let _ = session.logout().await;
    Ok(Fetched { uid_validity, mails })
}
