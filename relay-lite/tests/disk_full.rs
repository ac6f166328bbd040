//! A full disk under relay-lite. The data directory is an 8 MiB tmpfs, part of it taken by a
//! ballast file; sealed letagents envelopes, Stringcup messages and Agent Mail packets of
//! 20-30 KB (all three go through the one writer) are sent one at a time until the disk has
//! refused several writes in a row. While it is full, alice logs a new mailbox in and acks three
//! envelopes. Then the ballast is deleted, more of each is sent, the relay is restarted on the
//! same directory, and everything is reconciled:
//!
//! - every send answered `2xx` is in its mailbox exactly once, and no refused send is;
//! - every refusal is a retryable storage status: `507` on a letagents or Stringcup send (both
//!   define `507` as "not stored, retry later"), `503` elsewhere, always with `Retry-After`;
//! - a login or ack answered `200` while full really happened (the mailbox exists, the envelopes
//!   are gone), and one refused did not;
//! - once space returns, the relay accepts writes again by itself.
//!
//! The second test does the same on the PostgreSQL backend (letagents, the family it serves that
//! the first test fills): the relay's tables live in a tablespace on the small disk.
//!
//! Mounting needs root. Without it the test prints why and passes, unless
//! `SWITCHBOARD_REQUIRE_TMPFS=1` (CI) makes that a failure; the PostgreSQL one also needs
//! PostgreSQL (see `pg_common`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;
mod pg_common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Api, Owner, http_client};
use data_encoding::BASE64;
use ed25519_dalek::SigningKey;
use relay_lite::store::Family;
use relay_lite::{Config, RunningRelay};
use serde_json::{Value, json};
use switchboard_core::protocol::agent_identity::jwt::sign_request_jwt;
use switchboard_core::protocol::agent_identity::{AgentId, Origin};
use switchboard_core::protocol::agent_mail::card::CardPayload;
use switchboard_core::protocol::agent_mail::packet::{SealRequest, seal as seal_packet};
use switchboard_core::protocol::agent_mail::{DAY_MS, Id16, MailboxCard, Message, Part};
use switchboard_core::protocol::letagents::relay_auth::{self, Login};
use switchboard_core::protocol::letagents::wire::InboxResponse;
use switchboard_core::protocol::letagents::{Inner, Kind, PeerKeys, open, seal};
use switchboard_core::util::{OsRng, SeededRng, b64u_decode, now_ms, random_array};
use x25519_dalek::{PublicKey, StaticSecret};

/// A tmpfs of a fixed size mounted on a fresh directory, unmounted when dropped (also when the
/// test panics; lazily if something still holds a file open).
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// Mounts `size` (e.g. `8m`), or says why not: a failure under `SWITCHBOARD_REQUIRE_TMPFS=1`,
    /// a printed skip otherwise.
    fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(dir.path())
            .output();
        let why = match mounted {
            Ok(out) if out.status.success() => return Some(Self { dir }),
            Ok(out) => format!("mount -t tmpfs failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
            Err(e) => format!("cannot run mount: {e}"),
        };
        if std::env::var("SWITCHBOARD_REQUIRE_TMPFS").as_deref() == Ok("1") {
            panic!("SWITCHBOARD_REQUIRE_TMPFS=1 but no tmpfs could be mounted (needs root): {why}");
        }
        eprintln!("skipping the disk-full test: {why} (needs root; SWITCHBOARD_REQUIRE_TMPFS=1 makes this a failure)");
        None
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let path = self.dir.path();
        let plain = std::process::Command::new("umount").arg(path).status();
        if !plain.is_ok_and(|s| s.success()) {
            let _ = std::process::Command::new("umount").arg("-l").arg(path).status();
        }
    }
}

/// The relay under test: in process, on a data directory inside the small disk, always on the
/// same address (Agent Mail's origin is the address, and the card routes to it).
struct Relay {
    running: RunningRelay,
    config: Config,
    api: Api,
}

impl Relay {
    async fn start(data: &Path) -> Self {
        Self::spawn(Self::config(data)).await
    }

    /// The relay's configuration with every limit that would refuse before the disk does off.
    fn config(data: &Path) -> Config {
        let mut config = Config::new("127.0.0.1:0".parse().unwrap(), data);
        config.limits.sends_per_minute = 0;
        config.limits.ip_requests_per_minute = 0;
        config.limits.mailbox_capacity = 100_000;
        config.limits.stringcup.sends_per_hour = 0;
        config.limits.stringcup.inbox_requests_per_hour = 0;
        config.limits.stringcup.registrations_per_hour_per_ip = 0;
        config
    }

    async fn spawn(config: Config) -> Self {
        let running = relay_lite::spawn(config.clone()).await.unwrap();
        let mut config = config;
        config.listen = running.addr;
        let api = Api { http: http_client(), addr: running.addr, scheme: "http" };
        Self { running, config, api }
    }

    async fn restart(self) -> Self {
        let Self { running, config, .. } = self;
        running.shutdown().await.unwrap();
        Self::spawn(config).await
    }

    fn origin(&self) -> Origin {
        Origin::parse(&format!("https://{}", self.api.addr)).unwrap()
    }
}

/// An HTTP answer: status, `Retry-After`, the error code of either error shape, and the body.
#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: Option<String>,
    code: String,
    body: Value,
}

async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap_or(Value::Null);
    let code = body["error"]["code"].as_str().or(body["error"].as_str()).unwrap_or_default().to_owned();
    Answer { status, retry_after, code, body }
}

impl Answer {
    fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// Why this refusal is not a clear, retryable storage status (`expected`), if it is not.
    fn storage_refusal_problem(&self, expected: u16) -> Option<String> {
        if self.status == expected && self.retry_after.is_some() && self.code.starts_with("storage_") {
            return None;
        }
        Some(format!("expected {expected} storage_* with Retry-After, got {self:?}"))
    }
}

/// alice's letagents mailbox: her keys, and what a sender needs to seal to her.
struct LetagentsMailbox {
    owner: Owner,
    boxs: StaticSecret,
    keys: PeerKeys,
}

impl LetagentsMailbox {
    fn new() -> Self {
        let owner = Owner::new();
        let boxs = StaticSecret::from(random_array::<32>());
        let keys = PeerKeys { sig: owner.key.verifying_key().to_bytes(), boxk: PublicKey::from(&boxs).to_bytes() };
        Self { owner, boxs, keys }
    }
}

/// A real sealed envelope from `bob` to `alice`, about 30 KB, whose text starts with `tag`.
fn sealed(bob: &SigningKey, alice: &LetagentsMailbox, tag: &str) -> Vec<u8> {
    let bob_keys = PeerKeys { sig: bob.verifying_key().to_bytes(), boxk: [9; 32] };
    let mut text = format!("{tag}|");
    text.extend(std::iter::repeat_n('x', 29_000));
    let inner =
        Inner::new(&bob_keys, &alice.keys.mailbox_id(), now_ms(), uuid::Uuid::new_v4(), Kind::Send, text.into());
    seal(bob, &alice.keys, &serde_json::to_string(&inner).unwrap(), &mut OsRng).unwrap()
}

async fn la_send(api: &Api, to: &LetagentsMailbox, body: Vec<u8>) -> Answer {
    answer(api.try_send_raw(&to.owner.id, &to.owner.drop, body).await.unwrap()).await
}

async fn la_login(api: &Api, login: &Login, id: &str) -> Answer {
    answer(api.http.get(api.url(&format!("/v1/inbox/{id}?{}", login.query()))).send().await.unwrap()).await
}

async fn la_ack(api: &Api, owner: &Owner, seqs: &[i64]) -> Answer {
    let query = relay_auth::sign_ack(&owner.key, &api.host(), owner.next_ts(), seqs);
    answer(api.http.post(api.url(&format!("/v1/ack/{}?{query}", owner.id))).send().await.unwrap()).await
}

/// Every envelope waiting for `alice`, opened: (seq, tag), read page by page (acking each).
async fn la_drain(api: &Api, alice: &LetagentsMailbox) -> Vec<(i64, String)> {
    let mut out = Vec::new();
    loop {
        let page = la_login(api, &alice.owner.login(&api.host()), &alice.owner.id).await;
        assert_eq!(page.status, 200, "{page:?}");
        let page: InboxResponse = serde_json::from_value(page.body).unwrap();
        if page.msgs.is_empty() {
            return out;
        }
        let seqs: Vec<i64> = page.msgs.iter().map(|m| m.seq).collect();
        for m in page.msgs {
            let opened = open(&b64u_decode(&m.ct).unwrap(), &alice.boxs, &alice.keys).expect("a stored envelope opens");
            out.push((m.seq, opened.inner.text().split('|').next().unwrap().to_owned()));
        }
        let acked = la_ack(api, &alice.owner, &seqs).await;
        assert_eq!(acked.status, 200, "{acked:?}");
    }
}

/// A registered Stringcup identity.
struct ScAgent {
    id: String,
    token: String,
}

async fn sc_register(api: &Api) -> ScAgent {
    let body = json!({"identity_public_key": BASE64.encode(&random_array::<32>()), "algo": "x25519"});
    let reply = answer(api.http.post(api.url("/api/v2/identities")).json(&body).send().await.unwrap()).await;
    assert_eq!(reply.status, 201, "{reply:?}");
    ScAgent {
        id: reply.body["id"].as_str().unwrap().to_owned(),
        token: reply.body["api_token"].as_str().unwrap().to_owned(),
    }
}

async fn sc_send(api: &Api, from: &ScAgent, to: &ScAgent, tag: &str) -> Answer {
    let mut ciphertext = format!("{tag}|").into_bytes();
    ciphertext.resize(30_000, b'.');
    let body = json!({
        "recipient_id": to.id,
        "header": {
            "version": 2,
            "algo": "x25519+ecies+aes256gcm",
            "ephemeral_pub": BASE64.encode(&random_array::<32>()),
            "iv": BASE64.encode(&random_array::<12>()),
        },
        "ciphertext": BASE64.encode(&ciphertext),
    });
    let request = api.http.post(api.url("/api/v2/messages")).bearer_auth(&from.token).json(&body);
    answer(request.send().await.unwrap()).await
}

/// The tags of every message in `who`'s Stringcup inbox (a read-only cursor sweep).
async fn sc_inbox_tags(api: &Api, who: &ScAgent) -> Vec<String> {
    let mut tags = Vec::new();
    let mut since = 0;
    loop {
        let url = api.url(&format!("/api/v2/messages?limit=200&since_id={since}"));
        let page = answer(api.http.get(url).bearer_auth(&who.token).send().await.unwrap()).await;
        assert_eq!(page.status, 200, "{page:?}");
        for m in page.body["messages"].as_array().unwrap() {
            let ciphertext = BASE64.decode(m["ciphertext"].as_str().unwrap().as_bytes()).unwrap();
            let text = String::from_utf8(ciphertext).unwrap();
            tags.push(text.split('|').next().unwrap().to_owned());
        }
        if page.body["has_more"] != true {
            return tags;
        }
        since = page.body["next_since_id"].as_i64().unwrap();
    }
}

/// carol's Agent Mail mailbox and the key that signs its card and owner tokens.
const AM_MAILBOX: Id16 = Id16([7; 16]);

fn am_card(owner: &SigningKey, origin: &Origin) -> MailboxCard {
    let now = now_ms();
    let payload = CardPayload {
        mailbox_id: AM_MAILBOX,
        expires_at: now + DAY_MS,
        receive_until: now + 2 * DAY_MS,
        public_key: PublicKey::from(&StaticSecret::from([0xb1; 32])).to_bytes(),
        routes: vec![origin.clone()],
        max_packet_bytes: 65_536,
    };
    MailboxCard::sign(owner, now, 100, payload).unwrap()
}

fn am_path() -> String {
    format!("/v1/mailboxes/{AM_MAILBOX}/packets")
}

/// A sealed packet of about 20 KB from `sender` to `card`; its id is what the relay lists.
fn am_packet(sender: &SigningKey, card: &MailboxCard, nonce: u64, tag: &str) -> (String, Vec<u8>) {
    let now = now_ms();
    let mut rng = SeededRng::new(random_array());
    let mut text = format!("{tag}|");
    text.extend(std::iter::repeat_n('y', 20_000));
    let message =
        Message::new(&mut rng, AgentId::of(sender), *card.owner(), now, now + DAY_MS / 2, vec![Part::text(&text)]);
    let packet =
        seal_packet(&SealRequest { sender, card, message: &message, created_at: now, nonce }, now, &mut rng).unwrap();
    (packet.id().to_string(), packet.to_jcs())
}

async fn am_deliver(api: &Api, body: Vec<u8>) -> Answer {
    answer(api.http.post(api.url(&am_path())).body(body).send().await.unwrap()).await
}

/// Every packet id in carol's Agent Mail mailbox.
async fn am_list(api: &Api, owner: &SigningKey, origin: &Origin) -> Vec<String> {
    let now = now_ms() / 1000;
    let token = sign_request_jwt(owner, origin, now - 5, now + 120, None);
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{}?limit=1000", am_path());
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let page = answer(api.http.get(api.url(&url)).bearer_auth(&token).send().await.unwrap()).await;
        assert_eq!(page.status, 200, "{page:?}");
        for item in page.body["result"].as_array().unwrap() {
            ids.push(item["packet_id"].as_str().unwrap().to_owned());
        }
        match page.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return ids,
        }
    }
}

/// What was sent, by protocol and tag (or packet id), and whether the relay said "stored".
#[derive(Default)]
struct Ledger {
    letagents: BTreeMap<String, bool>,
    stringcup: BTreeMap<String, bool>,
    agent_mail: BTreeMap<String, bool>,
    problems: Vec<String>,
}

impl Ledger {
    /// Checks that a mailbox holds exactly what it should (`true`: answered `2xx` and not acked
    /// since), each once.
    fn reconcile(&mut self, what: &str, sent: &BTreeMap<String, bool>, found: &[String]) {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for tag in found {
            *counts.entry(tag.as_str()).or_default() += 1;
        }
        for (tag, expected) in sent {
            let n = counts.remove(tag.as_str()).unwrap_or(0);
            match (expected, n) {
                (true, 1) | (false, 0) => {}
                (true, 0) => self.problems.push(format!("{what} {tag}: answered 2xx but not on disk (lost)")),
                (true, _) => self.problems.push(format!("{what} {tag}: on disk {n} times")),
                (false, _) => {
                    self.problems.push(format!("{what} {tag}: refused (or acked) but on disk {n} time(s)"));
                }
            }
        }
        for (tag, n) in counts {
            self.problems.push(format!("{what} {tag}: stored {n} time(s) but never sent"));
        }
    }
}

fn mib(n: usize) -> usize {
    n * 1024 * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_never_acknowledges_a_write_it_did_not_commit_and_recovers_when_space_returns() {
    let Some(disk) = SmallDisk::mount("8m") else { return };
    let ballast: PathBuf = disk.path().join("ballast");
    std::fs::write(&ballast, vec![1u8; mib(2)]).unwrap();
    let data = disk.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let mut relay = Relay::start(&data).await;
    let mut ledger = Ledger::default();

    // Before the disk fills: alice's letagents mailbox with three envelopes she will ack while
    // full, two Stringcup identities, carol's Agent Mail card.
    let alice = LetagentsMailbox::new();
    let bob = SigningKey::from_bytes(&random_array());
    assert_eq!(la_login(&relay.api, &alice.owner.login(&relay.api.host()), &alice.owner.id).await.status, 200);
    for n in 0..3 {
        let tag = format!("la-early-{n}");
        let sent = la_send(&relay.api, &alice, sealed(&bob, &alice, &tag)).await;
        assert_eq!(sent.status, 202, "{sent:?}");
        ledger.letagents.insert(tag, true);
    }
    let early = la_login(&relay.api, &alice.owner.login(&relay.api.host()), &alice.owner.id).await;
    let early: InboxResponse = serde_json::from_value(early.body).unwrap();
    let early_seqs: Vec<i64> = early.msgs.iter().map(|m| m.seq).collect();
    assert_eq!(early_seqs.len(), 3);
    let (sc_sender, sc_recipient) = (sc_register(&relay.api).await, sc_register(&relay.api).await);
    let carol = SigningKey::from_bytes(&random_array());
    let dave = SigningKey::from_bytes(&random_array());
    let card = am_card(&carol, &relay.origin());
    let published =
        answer(relay.api.http.post(relay.api.url("/v1/mailboxes")).body(card.to_jcs()).send().await.unwrap()).await;
    assert_eq!(published.status, 200, "{published:?}");

    // Fill the disk: one send at a time, rotating through the three protocols, until the last
    // six writes in a row were refused (the original failure needed two failed commits in a row),
    // or 90 more were sent after the first refusal (a relay that acknowledges writes it cannot
    // commit never refuses six in a row; the reconciliation below finds them).
    let mut nonce = 1;
    let mut refused_in_a_row = 0;
    let mut refusals = 0;
    let mut sent = 0;
    let mut first_refusal = None;
    while refused_in_a_row < 6 && first_refusal.is_none_or(|at| sent < at + 90) {
        assert!(sent < 1_000, "the 8 MiB disk never filled after {sent} sends");
        let tag = format!("fill-{sent:04}");
        let (ok, problem) = match sent % 3 {
            0 => {
                let a = la_send(&relay.api, &alice, sealed(&bob, &alice, &tag)).await;
                ledger.letagents.insert(tag.clone(), a.ok());
                (a.ok(), a.storage_refusal_problem(507))
            }
            1 => {
                let a = sc_send(&relay.api, &sc_sender, &sc_recipient, &tag).await;
                ledger.stringcup.insert(tag.clone(), a.ok());
                (a.ok(), a.storage_refusal_problem(507))
            }
            _ => {
                nonce += 1;
                let (id, body) = am_packet(&dave, &card, nonce, &tag);
                let a = am_deliver(&relay.api, body).await;
                ledger.agent_mail.insert(id, a.ok());
                (a.ok(), a.storage_refusal_problem(503))
            }
        };
        sent += 1;
        if ok {
            refused_in_a_row = 0;
        } else {
            refused_in_a_row += 1;
            refusals += 1;
            first_refusal.get_or_insert(sent);
            ledger.problems.extend(problem.map(|p| format!("{tag}: {p}")));
        }
    }
    eprintln!("disk full after {sent} sends ({refusals} refused, the first at {first_refusal:?})");
    if refused_in_a_row < 6 {
        ledger
            .problems
            .push(format!("after its first refusal the full disk accepted writes again: {refusals} refused of {sent}"));
    }

    // While full: a login that would create erin's mailbox, and alice's ack of her first three.
    let erin = Owner::new();
    let erin_login = la_login(&relay.api, &erin.login(&relay.api.host()), &erin.id).await;
    if !erin_login.ok() {
        ledger.problems.extend(erin_login.storage_refusal_problem(503).map(|p| format!("login while full: {p}")));
    }
    let ack = la_ack(&relay.api, &alice.owner, &early_seqs).await;
    if !ack.ok() {
        ledger.problems.extend(ack.storage_refusal_problem(503).map(|p| format!("ack while full: {p}")));
    }
    eprintln!("while full: login {}, ack {}", erin_login.status, ack.status);
    let acked_early = ack.ok();
    if acked_early {
        for n in 0..3 {
            ledger.letagents.insert(format!("la-early-{n}"), false);
        }
    }

    // Space returns: the relay accepts writes again by itself.
    std::fs::remove_file(&ballast).unwrap();
    for n in 0..5 {
        let tag = format!("after-{n}");
        let a = la_send(&relay.api, &alice, sealed(&bob, &alice, &tag)).await;
        if !a.ok() {
            ledger.problems.push(format!("letagents {tag} after space returned: {a:?}"));
        }
        ledger.letagents.insert(tag.clone(), a.ok());
        let a = sc_send(&relay.api, &sc_sender, &sc_recipient, &tag).await;
        if !a.ok() {
            ledger.problems.push(format!("stringcup {tag} after space returned: {a:?}"));
        }
        ledger.stringcup.insert(tag.clone(), a.ok());
        nonce += 1;
        let (id, body) = am_packet(&dave, &card, nonce, &tag);
        let a = am_deliver(&relay.api, body).await;
        if !a.ok() {
            ledger.problems.push(format!("agent mail {tag} after space returned: {a:?}"));
        }
        ledger.agent_mail.insert(id, a.ok());
    }

    // Only what is on disk counts: restart on the same directory, then reconcile.
    relay = relay.restart().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let letagents: Vec<String> = la_drain(&relay.api, &alice).await.into_iter().map(|(_, tag)| tag).collect();
    let stringcup = sc_inbox_tags(&relay.api, &sc_recipient).await;
    let agent_mail = am_list(&relay.api, &carol, &relay.origin()).await;
    let (la_sent, sc_sent, am_sent) = (
        std::mem::take(&mut ledger.letagents),
        std::mem::take(&mut ledger.stringcup),
        std::mem::take(&mut ledger.agent_mail),
    );
    ledger.reconcile("letagents", &la_sent, &letagents);
    ledger.reconcile("stringcup", &sc_sent, &stringcup);
    ledger.reconcile("agent mail", &am_sent, &agent_mail);
    // erin's mailbox exists exactly when her login was answered 200: a send to it is 202, else 404.
    let to_erin =
        answer(relay.api.try_send_raw(&erin.id, &erin.drop, sealed(&bob, &alice, "erin")).await.unwrap()).await;
    let expected = if erin_login.ok() { 202 } else { 404 };
    if to_erin.status != expected {
        ledger.problems.push(format!(
            "login while full answered {} but a send to the mailbox now answers {to_erin:?}",
            erin_login.status
        ));
    }
    let accepted = [&la_sent, &sc_sent, &am_sent].iter().flat_map(|m| m.values()).filter(|ok| **ok).count();
    eprintln!(
        "{accepted} writes acknowledged; on disk: {} letagents, {} stringcup, {} agent mail",
        letagents.len(),
        stringcup.len(),
        agent_mail.len()
    );
    relay.running.shutdown().await.unwrap();
    drop(disk);
    assert!(ledger.problems.is_empty(), "{} problems:\n{}", ledger.problems.len(), ledger.problems.join("\n"));
}

/// The same on the PostgreSQL backend (issue 13 §1, "on both relay backends"). The relay's tables
/// are made in a tablespace on the small disk (`default_tablespace` of its database) while the
/// cluster's catalogs and WAL stay on the big one, so a full disk reaches the relay as
/// PostgreSQL's `53100 disk_full` when a table or index cannot grow. letagents sends until six
/// in a row are refused, a login and an ack while full, space returns, five more sends, then a
/// new relay instance on the same database reconciles every answer against what is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_postgres_tablespace_never_acknowledges_a_write_it_did_not_commit() {
    let Some(cluster) = pg_common::cluster() else { return };
    let Some(disk) = SmallDisk::mount("8m") else { return };
    let ballast: PathBuf = disk.path().join("ballast");
    std::fs::write(&ballast, vec![1u8; mib(4)]).unwrap();
    let space = disk.path().join("tablespace");
    std::fs::create_dir(&space).unwrap();
    for dir in [disk.path(), space.as_path()] {
        // The server runs as `postgres` (the tmpfs was mounted 0700 for root).
        let chown = std::process::Command::new("chown").arg("postgres:").arg(dir).status().unwrap();
        assert!(chown.success(), "chown postgres: {}", dir.display());
    }
    let url = cluster.fresh_database().await;
    let database = url.rsplit('/').next().unwrap().to_owned();
    let tablespace = format!("small_{database}");
    let pool = sqlx::PgPool::connect(&cluster.url("postgres")).await.unwrap();
    for sql in [
        format!("CREATE TABLESPACE {tablespace} LOCATION '{}'", space.display()),
        format!("ALTER DATABASE {database} SET default_tablespace = {tablespace}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&pool).await.unwrap();
    }

    let scratch = tempfile::tempdir().unwrap();
    let mut config = Relay::config(scratch.path());
    config.database = Some(url.clone());
    config.families = Family::ON_POSTGRES.to_vec();
    let mut relay = Relay::spawn(config).await;
    let mut ledger = Ledger::default();
    let alice = LetagentsMailbox::new();
    let bob = SigningKey::from_bytes(&random_array());
    assert_eq!(la_login(&relay.api, &alice.owner.login(&relay.api.host()), &alice.owner.id).await.status, 200);
    for n in 0..3 {
        let tag = format!("la-early-{n}");
        assert_eq!(la_send(&relay.api, &alice, sealed(&bob, &alice, &tag)).await.status, 202);
        ledger.letagents.insert(tag, true);
    }
    let early = la_login(&relay.api, &alice.owner.login(&relay.api.host()), &alice.owner.id).await;
    let early: InboxResponse = serde_json::from_value(early.body).unwrap();
    let early_seqs: Vec<i64> = early.msgs.iter().map(|m| m.seq).collect();
    assert_eq!(early_seqs.len(), 3);

    let (mut sent, mut refusals, mut refused_in_a_row, mut first_refusal) = (0, 0, 0, None);
    while refused_in_a_row < 6 && first_refusal.is_none_or(|at| sent < at + 90) {
        assert!(sent < 1_000, "the tablespace never filled after {sent} sends");
        let tag = format!("fill-{sent:04}");
        let a = la_send(&relay.api, &alice, sealed(&bob, &alice, &tag)).await;
        ledger.letagents.insert(tag.clone(), a.ok());
        sent += 1;
        if a.ok() {
            refused_in_a_row = 0;
        } else {
            refused_in_a_row += 1;
            refusals += 1;
            first_refusal.get_or_insert(sent);
            ledger.problems.extend(a.storage_refusal_problem(507).map(|p| format!("{tag}: {p}")));
        }
    }
    eprintln!("tablespace full after {sent} sends ({refusals} refused, the first at {first_refusal:?})");
    if refused_in_a_row < 6 {
        ledger
            .problems
            .push(format!("after its first refusal the full disk accepted writes again: {refusals} of {sent}"));
    }
    let erin = Owner::new();
    let erin_login = la_login(&relay.api, &erin.login(&relay.api.host()), &erin.id).await;
    if !erin_login.ok() {
        ledger.problems.extend(erin_login.storage_refusal_problem(503).map(|p| format!("login while full: {p}")));
    }
    let ack = la_ack(&relay.api, &alice.owner, &early_seqs).await;
    if !ack.ok() {
        ledger.problems.extend(ack.storage_refusal_problem(503).map(|p| format!("ack while full: {p}")));
    }
    eprintln!("while full: login {}, ack {}", erin_login.status, ack.status);
    if ack.ok() {
        for n in 0..3 {
            ledger.letagents.insert(format!("la-early-{n}"), false);
        }
    }

    std::fs::remove_file(&ballast).unwrap();
    for n in 0..5 {
        let tag = format!("after-{n}");
        let a = la_send(&relay.api, &alice, sealed(&bob, &alice, &tag)).await;
        if !a.ok() {
            ledger.problems.push(format!("letagents {tag} after space returned: {a:?}"));
        }
        ledger.letagents.insert(tag, a.ok());
    }

    // What counts is what another instance reads from the database.
    relay = relay.restart().await;
    let found: Vec<String> = la_drain(&relay.api, &alice).await.into_iter().map(|(_, tag)| tag).collect();
    let expected = std::mem::take(&mut ledger.letagents);
    ledger.reconcile("letagents", &expected, &found);
    let to_erin =
        answer(relay.api.try_send_raw(&erin.id, &erin.drop, sealed(&bob, &alice, "erin")).await.unwrap()).await;
    if to_erin.status != if erin_login.ok() { 202 } else { 404 } {
        ledger.problems.push(format!("login while full answered {}, a send now {to_erin:?}", erin_login.status));
    }
    eprintln!("{} acknowledged, {} committed", expected.values().filter(|ok| **ok).count(), found.len());
    relay.running.shutdown().await.unwrap();
    for sql in [format!("DROP DATABASE {database} WITH (FORCE)"), format!("DROP TABLESPACE {tablespace}")] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&pool).await.unwrap();
    }
    pool.close().await;
    drop(disk);
    assert!(ledger.problems.is_empty(), "{} problems:\n{}", ledger.problems.len(), ledger.problems.join("\n"));
}
