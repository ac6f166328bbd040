//! The ASNET/1 service end to end over real SMTP: mail goes into relay-lite's SMTP listener with
//! lettre as the client (as the trusted MTA would hand it over: topmost `Received:` with a queue
//! id, `Authentication-Results` of the trusted authserv-id), and replies come out through a real
//! SMTP receiver as smarthost (Debian's python3-aiosmtpd writing a Maildir).
//!
//! Needs `/usr/bin/python3` with `aiosmtpd` (apt `python3-aiosmtpd`, in scripts/install-deps.sh):
//! skipped with a reason when missing, failed under `SWITCHBOARD_REQUIRE_MAIL=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use lettre::address::Envelope;
use lettre::{AsyncSmtpTransport, AsyncTransport as _, Tokio1Executor};
use relay_lite::asnet::{AsnetConfig, Smarthost};
use relay_lite::{Config, RunningRelay};
use serde_json::{Value as Json, json};
use switchboard_core::protocol::asnet::Mailbox;

const SERVICE: &str = "network@example.test";
const AUTHSERV: &str = "mx.example.test";
const PYTHON: &str = "/usr/bin/python3";

/// Whether the real SMTP receiver is installed; panics under `SWITCHBOARD_REQUIRE_MAIL=1`.
fn mail_tools_present(test: &str) -> bool {
    let ok = std::process::Command::new(PYTHON)
        .args(["-c", "import aiosmtpd"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if std::env::var("SWITCHBOARD_REQUIRE_MAIL").as_deref() == Ok("1") {
            panic!("{test}: {PYTHON} with aiosmtpd is required (apt install python3-aiosmtpd)");
        }
        eprintln!("skipped {test}: {PYTHON} with aiosmtpd is missing (apt install python3-aiosmtpd)");
    }
    ok
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A reply as the smarthost received it.
#[derive(Debug)]
struct Received {
    headers: Vec<(String, String)>,
    json: Json,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn kind(&self) -> &str {
        self.json["type"].as_str().unwrap()
    }

    fn str(&self, key: &str) -> String {
        self.json[key].as_str().unwrap_or_else(|| panic!("{key} in {}", self.json)).to_owned()
    }
}

/// The smarthost: aiosmtpd's Mailbox handler writing each message into a Maildir, with the
/// envelope in `X-MailFrom` / `X-RcptTo`.
struct SmtpSink {
    child: tokio::process::Child,
    port: u16,
    maildir: PathBuf,
    seen: HashSet<PathBuf>,
}

impl SmtpSink {
    async fn start(dir: &Path) -> Self {
        Self::start_on(dir, free_port()).await
    }

    async fn start_on(dir: &Path, port: u16) -> Self {
        let maildir = dir.join("smarthost");
        let child = tokio::process::Command::new(PYTHON)
            .args(["-m", "aiosmtpd", "-n", "-l", &format!("127.0.0.1:{port}"), "-c", "aiosmtpd.handlers.Mailbox"])
            .arg(&maildir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(Instant::now() < deadline, "aiosmtpd did not start listening");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self { child, port, maildir, seen: HashSet::new() }
    }

    /// Messages not yet taken, oldest first (Maildir names start `secs.Mmicros`).
    fn fresh(&self) -> Vec<PathBuf> {
        let Ok(dir) = std::fs::read_dir(self.maildir.join("new")) else { return Vec::new() };
        let mut files: Vec<((u64, u64), PathBuf)> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| !self.seen.contains(p))
            .map(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                let mut parts = name.split('.');
                let secs = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
                let micros = parts
                    .next()
                    .and_then(|s| s.strip_prefix('M'))
                    .and_then(|s| s.split('P').next())
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                ((secs, micros), p)
            })
            .collect();
        files.sort();
        files.into_iter().map(|(_, p)| p).collect()
    }

    fn parse(path: &Path) -> Received {
        let text = std::fs::read_to_string(path).unwrap();
        let text = text.replace("\r\n", "\n");
        let (head, body) = text.split_once("\n\n").unwrap();
        let mut headers: Vec<(String, String)> = Vec::new();
        for line in head.lines() {
            if line.starts_with([' ', '\t']) {
                headers.last_mut().unwrap().1.push_str(line.trim_start());
            } else {
                let (n, v) = line.split_once(':').unwrap();
                headers.push((n.to_owned(), v.trim().to_owned()));
            }
        }
        Received { headers, json: serde_json::from_str(body).unwrap() }
    }

    /// The next reply to `to`, which must be of type `kind`.
    async fn expect(&mut self, to: &str, kind: &str) -> Received {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for path in self.fresh() {
                let msg = Self::parse(&path);
                if msg.header("X-RcptTo") == Some(to) {
                    self.seen.insert(path);
                    assert_eq!(msg.kind(), kind, "next reply to {to}: {}", msg.json);
                    check_reply_headers(&msg, to);
                    return msg;
                }
            }
            assert!(Instant::now() < deadline, "no {kind} reply to {to} within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every message received so far, taken or not.
    fn total(&self) -> usize {
        std::fs::read_dir(self.maildir.join("new")).map_or(0, |d| d.count())
    }
}

/// Every reply: from the service, to the member, automatic, null reverse path, stable id.
fn check_reply_headers(msg: &Received, to: &str) {
    assert_eq!(msg.header("From"), Some(SERVICE));
    assert_eq!(msg.header("To"), Some(to));
    assert_eq!(msg.header("Auto-Submitted"), Some("auto-generated"));
    assert_eq!(msg.header("X-MailFrom"), Some("<>"), "replies use the null reverse path");
    let rid = msg.header("X-ASNET-Response-ID").unwrap();
    assert_eq!(msg.json["responseId"].as_str(), Some(rid));
    assert_eq!(msg.json["protocol"], "ASNET/1");
}

/// A relay with the ASNET service sending replies to `sink`.
async fn relay_with_asnet(dir: &Path, sink: &SmtpSink, limits: Option<(u32, u32)>) -> RunningRelay {
    relay_with_smarthost(dir, sink.port, limits).await
}

async fn relay_with_smarthost(dir: &Path, smarthost_port: u16, limits: Option<(u32, u32)>) -> RunningRelay {
    let mut config = Config::new("127.0.0.1:0".parse().unwrap(), dir.join("relay"));
    let mut asnet = AsnetConfig::new(
        Mailbox::parse(SERVICE).unwrap(),
        "127.0.0.1:0".parse().unwrap(),
        Smarthost { host: "127.0.0.1".into(), port: smarthost_port },
        AUTHSERV.into(),
    );
    if let Some((per_sender, global)) = limits {
        asnet.limits.per_sender = per_sender;
        asnet.limits.global = global;
    }
    config.asnet = Some(asnet);
    relay_lite::spawn(config).await.unwrap()
}

/// One inbound mail as the trusted MTA hands it over.
struct Mail {
    from: String,
    queue_id: String,
    body: String,
    auth: String,
    extra: String,
    content_type: String,
}

impl Mail {
    fn command(from: &str, body: Json) -> Self {
        let domain = from.rsplit_once('@').unwrap().1;
        Self {
            from: from.into(),
            queue_id: format!("4Q{}", switchboard_core::util::hex(&switchboard_core::util::random_array::<6>())),
            body: body.to_string(),
            auth: format!(
                "{AUTHSERV}; spf=pass smtp.mailfrom={from};\r\n dkim=pass header.d={domain} header.b=AbCd; dmarc=pass header.from={domain}"
            ),
            extra: String::new(),
            content_type: "text/plain; charset=utf-8".into(),
        }
    }

    fn raw(&self) -> Vec<u8> {
        format!(
            "Received: from mail.example.net (mail.example.net [198.18.0.2])\r\n\
             \tby {AUTHSERV} (Postfix) with ESMTPS id {qid}\r\n\
             \tfor <{SERVICE}>; Tue, 01 Dec 2026 20:00:00 +0000 (UTC)\r\n\
             Authentication-Results: {auth}\r\n\
             From: Someone <{from}>\r\n\
             To: {SERVICE}\r\n\
             Subject: asnet\r\n\
             Date: Tue, 01 Dec 2026 20:00:00 +0000\r\n\
             Message-ID: <{qid}@example.net>\r\n\
             {extra}\
             MIME-Version: 1.0\r\n\
             Content-Type: {ctype}\r\n\
             \r\n\
             {body}\r\n",
            qid = self.queue_id,
            auth = self.auth,
            from = self.from,
            extra = self.extra,
            ctype = self.content_type,
            body = self.body,
        )
        .into_bytes()
    }
}

/// Sends `raw` into the listener (MAIL FROM `mail_from`, RCPT TO `rcpt`); the final reply's text.
async fn submit(
    smtp: SocketAddr,
    mail_from: &str,
    rcpt: &str,
    raw: &[u8],
) -> Result<String, lettre::transport::smtp::Error> {
    let transport = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1").port(smtp.port()).build();
    let envelope = Envelope::new(Some(mail_from.parse().unwrap()), vec![rcpt.parse().unwrap()]).unwrap();
    let response = transport.send_raw(&envelope, raw).await?;
    Ok(response.message().collect::<Vec<_>>().join(" "))
}

async fn send(smtp: SocketAddr, mail: &Mail) -> String {
    submit(smtp, &mail.from, SERVICE, &mail.raw()).await.unwrap()
}

/// Sends a protected command, answers its challenge (checking it names the exact command) and
/// returns the VERIFY's SMTP reply text.
async fn challenge_and_verify(smtp: SocketAddr, sink: &mut SmtpSink, who: &str, command: Json) -> String {
    assert_eq!(send(smtp, &Mail::command(who, command.clone())).await, "2.0.0 Ok: processed");
    let challenge = sink.expect(who, "CHALLENGE").await;
    assert_eq!(challenge.json["action"], command, "the challenge names the exact action");
    let code = challenge.str("code");
    assert_eq!(code.len(), 32);
    let verify =
        json!({"protocol": "ASNET/1", "command": "VERIFY", "challengeId": challenge.str("challengeId"), "code": code});
    send(smtp, &Mail::command(who, verify)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_register_connect_accept_a_subset_list_and_disconnect_over_smtp() {
    if !mail_tools_present("asnet lifecycle") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut sink = SmtpSink::start(dir.path()).await;
    let relay = relay_with_asnet(dir.path(), &sink, None).await;
    let smtp = relay.asnet.as_ref().unwrap().smtp_addr;
    let (alice, bob) = ("alice@example.net", "bob@example.org");

    let register = json!({"protocol": "ASNET/1", "command": "REGISTER", "discovery": true});
    assert_eq!(challenge_and_verify(smtp, &mut sink, alice, register).await, "2.0.0 Ok: processed");
    let registered = sink.expect(alice, "REGISTERED").await;
    let alice_id = registered.str("memberId");
    assert_eq!(registered.str("marker"), format!("agent-society:v1:{alice_id}"));

    let register = json!({"protocol": "ASNET/1", "command": "REGISTER"});
    assert_eq!(challenge_and_verify(smtp, &mut sink, bob, register).await, "2.0.0 Ok: processed");
    let bob_id = sink.expect(bob, "REGISTERED").await.str("memberId");
    assert_ne!(alice_id, bob_id);

    // LOOKUP is public, answered at once, and never shows a mailbox.
    let lookup = json!({"protocol": "ASNET/1", "command": "LOOKUP", "memberId": alice_id});
    assert_eq!(send(smtp, &Mail::command(bob, lookup)).await, "2.0.0 Ok: processed");
    let found = sink.expect(bob, "LOOKUP").await;
    assert_eq!(found.json["member"]["marker"], format!("agent-society:v1:{alice_id}"));
    assert!(!found.json.to_string().contains(alice), "a lookup never reveals a mailbox");

    let connect = json!({"protocol": "ASNET/1", "command": "CONNECT", "memberId": bob_id, "scopes": ["contact:email", "profile:basic"]});
    assert_eq!(challenge_and_verify(smtp, &mut sink, alice, connect).await, "2.0.0 Ok: processed");
    let requested = sink.expect(alice, "CONNECTION_REQUESTED").await;
    let invitation = sink.expect(bob, "INVITATION").await;
    let request_id = invitation.str("requestId");
    assert_eq!(requested.str("requestId"), request_id);
    assert_eq!(invitation.str("fromMemberId"), alice_id);
    assert_eq!(invitation.json["scopes"], json!(["contact:email", "profile:basic"]));

    let accept =
        json!({"protocol": "ASNET/1", "command": "ACCEPT", "requestId": request_id, "scopes": ["contact:email"]});
    assert_eq!(challenge_and_verify(smtp, &mut sink, bob, accept).await, "2.0.0 Ok: processed");
    let to_bob = sink.expect(bob, "CONNECTED").await;
    let to_alice = sink.expect(alice, "CONNECTED").await;
    assert_eq!(to_bob.str("memberId"), alice_id);
    assert_eq!(to_alice.str("memberId"), bob_id);
    assert_eq!(to_alice.json["scopes"], json!(["contact:email"]), "the invitee's subset is what is granted");

    let list = json!({"protocol": "ASNET/1", "command": "LIST CONNECTIONS"});
    assert_eq!(challenge_and_verify(smtp, &mut sink, alice, list.clone()).await, "2.0.0 Ok: processed");
    let listed = sink.expect(alice, "CONNECTIONS").await;
    assert_eq!(listed.json["connections"], json!([{"memberId": bob_id, "scopes": ["contact:email"]}]));

    let disconnect = json!({"protocol": "ASNET/1", "command": "DISCONNECT", "memberId": alice_id});
    assert_eq!(challenge_and_verify(smtp, &mut sink, bob, disconnect).await, "2.0.0 Ok: processed");
    assert_eq!(sink.expect(bob, "DISCONNECTED").await.str("memberId"), alice_id);
    assert_eq!(sink.expect(alice, "DISCONNECTED").await.str("memberId"), bob_id, "the other member is told");

    assert_eq!(challenge_and_verify(smtp, &mut sink, alice, list).await, "2.0.0 Ok: processed");
    assert_eq!(sink.expect(alice, "CONNECTIONS").await.json["connections"], json!([]));

    // Every reply was sent and its body (codes included) dropped from the database. The sink has
    // the last reply as soon as its DATA arrives, a moment before the relay reads the smarthost's
    // `250` and marks the entry sent: wait for that, briefly.
    let db = relay.asnet.as_ref().unwrap().db();
    let mut tries = 0;
    let (outbox, all_sent) = loop {
        let outbox = db.outbox().await.unwrap();
        let all_sent = outbox.iter().all(|e| e.state.as_str() == "sent" && e.body.is_empty());
        tries += 1;
        if all_sent || tries == 100 {
            break (outbox, all_sent);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(all_sent, "{outbox:?}");
    relay.shutdown().await.unwrap();
    drop(sink.child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_mail_is_dropped_without_a_reply_and_a_replayed_delivery_id_is_ignored() {
    if !mail_tools_present("asnet refusals") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut sink = SmtpSink::start(dir.path()).await;
    let relay = relay_with_asnet(dir.path(), &sink, None).await;
    let smtp = relay.asnet.as_ref().unwrap().smtp_addr;
    let alice = "alice@example.net";
    let register = json!({"protocol": "ASNET/1", "command": "REGISTER"});

    let mut no_dkim = Mail::command(alice, register.clone());
    no_dkim.auth = format!(
        "{AUTHSERV}; spf=pass smtp.mailfrom={alice}; dkim=fail header.d=example.net; dmarc=pass header.from=example.net"
    );
    assert_eq!(send(smtp, &no_dkim).await, "2.6.0 Dropped: DKIM did not pass");

    let mut wrong_authserv = Mail::command(alice, register.clone());
    wrong_authserv.auth = format!(
        "evil.example.test; spf=pass smtp.mailfrom={alice}; dkim=pass header.d=example.net; dmarc=pass header.from=example.net"
    );
    assert_eq!(
        send(smtp, &wrong_authserv).await,
        "2.6.0 Dropped: no Authentication-Results from the trusted authserv-id"
    );

    let mut reply_to = Mail::command(alice, register.clone());
    reply_to.extra = "Reply-To: mallory@example.com\r\n".into();
    assert_eq!(send(smtp, &reply_to).await, "2.6.0 Dropped: Reply-To present");

    let mut html = Mail::command(alice, register.clone());
    html.content_type = "text/html; charset=utf-8".into();
    assert_eq!(send(smtp, &html).await, "2.6.0 Dropped: HTML body");

    let mallory = Mail::command(alice, register.clone());
    let spoofed = submit(smtp, "mallory@example.com", SERVICE, &mallory.raw()).await.unwrap();
    assert_eq!(spoofed, "2.6.0 Dropped: envelope sender differs from From");

    // Over 32 KiB: refused while reading (552), whatever the content.
    let mut big = Mail::command(alice, register.clone());
    big.extra = format!("X-Padding: {}\r\n", "a".repeat(900)).repeat(40);
    let err = submit(smtp, alice, SERVICE, &big.raw()).await.unwrap_err();
    assert!(err.is_permanent(), "{err}");
    assert!(err.to_string().contains("too big"), "{err}");

    // Another recipient is refused at RCPT.
    let err = submit(smtp, alice, "postmaster@example.test", &Mail::command(alice, register.clone()).raw())
        .await
        .unwrap_err();
    assert!(err.is_permanent(), "{err}");

    // A good command is processed once; its delivery id replayed is ignored with no reply.
    let good = Mail::command(alice, register.clone());
    assert_eq!(send(smtp, &good).await, "2.0.0 Ok: processed");
    assert_eq!(send(smtp, &good).await, "2.0.0 Ok: ignored (DUPLICATE_DELIVERY)");
    sink.expect(alice, "CHALLENGE").await;
    // The dispatcher sends in order and paces at 1/s: after another second and a half nothing
    // else may have arrived.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(sink.total(), 1, "only the one challenge was mailed");
    relay.shutdown().await.unwrap();
    drop(sink.child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_is_retried_with_backoff_until_the_smarthost_answers() {
    if !mail_tools_present("asnet retry") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let relay = relay_with_smarthost(dir.path(), port, None).await;
    let smtp = relay.asnet.as_ref().unwrap().smtp_addr;
    let lookup =
        json!({"protocol": "ASNET/1", "command": "LOOKUP", "memberId": "mem_0123456789abcdef0123456789abcdef"});
    assert_eq!(send(smtp, &Mail::command("dave@example.net", lookup)).await, "2.0.0 Ok: processed");
    // Nothing listens yet: the first attempt fails at once and the next waits 2 s.
    let db = relay.asnet.as_ref().unwrap().db().clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let outbox = db.outbox().await.unwrap();
        if outbox[0].failures >= 1 {
            assert_eq!(outbox[0].state.as_str(), "queued", "a connection failure is temporary");
            assert!(!outbox[0].body.is_empty(), "the body is kept until the reply is sent");
            break;
        }
        assert!(Instant::now() < deadline, "no failed attempt recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut sink = SmtpSink::start_on(dir.path(), port).await;
    let reply = sink.expect("dave@example.net", "LOOKUP").await;
    assert_eq!(reply.json["member"], Json::Null);
    // The sink has the mail as soon as the smarthost accepted it; the dispatcher records that a
    // moment later.
    let deadline = Instant::now() + Duration::from_secs(5);
    let outbox = loop {
        let outbox = db.outbox().await.unwrap();
        if outbox[0].state.as_str() == "sent" || Instant::now() > deadline {
            break outbox;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].state.as_str(), "sent");
    assert!(outbox[0].body.is_empty());
    relay.shutdown().await.unwrap();
    drop(sink.child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_takes_asnet_keys_from_the_config_file_and_answers_a_lookup() {
    if !mail_tools_present("asnet binary") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut sink = SmtpSink::start(dir.path()).await;
    let config = dir.path().join("relay.json");
    std::fs::write(
        &config,
        json!({
            "listen": "127.0.0.1:0",
            "data": dir.path().join("data"),
            "asnet-address": SERVICE,
            "asnet-smtp-listen": "127.0.0.1:0",
            "asnet-smarthost": format!("127.0.0.1:{}", sink.port),
            "asnet-authserv-id": AUTHSERV,
        })
        .to_string(),
    )
    .unwrap();
    let relay = common::start_binary(&["--config", config.to_str().unwrap()], common::http_client()).await;
    let line = relay.preamble.iter().find_map(|l| l.strip_prefix("asnet smtp listening on ")).expect("asnet line");
    let smtp: SocketAddr = line.parse().unwrap();
    let lookup =
        json!({"protocol": "ASNET/1", "command": "LOOKUP", "memberId": "mem_0123456789abcdef0123456789abcdef"});
    assert_eq!(send(smtp, &Mail::command("carol@example.net", lookup)).await, "2.0.0 Ok: processed");
    let reply = sink.expect("carol@example.net", "LOOKUP").await;
    assert_eq!(reply.json["member"], Json::Null);
    drop(relay);
    drop(sink.child);
}

#[tokio::test]
async fn the_binary_refuses_a_partial_asnet_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_relay-lite"))
        .args(["--listen", "127.0.0.1:0", "--data", dir.path().to_str().unwrap(), "--asnet-address", SERVICE])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("asnet-smtp-listen"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
