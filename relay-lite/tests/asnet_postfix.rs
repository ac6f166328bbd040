//! The ASNET/1 service behind a real Postfix (Debian's, 3.7) on loopback: mail for the service
//! address enters Postfix's smtpd, Postfix relays it to relay-lite's SMTP listener (its queue id
//! in the topmost `Received:` becomes the delivery id), and replies sent to Postfix as smarthost
//! are delivered by Postfix's virtual(8) into the member's Maildir.
//!
//! Postfix here only accepts mail for `example.test`, `example.net` and `example.org` from
//! loopback, has no DNS, and sends anything else to `error:` so nothing can leave the machine.
//! It runs no DKIM/DMARC milter (no DNS to verify against), so the test client writes the
//! `Authentication-Results` header the MTA's milter would; what is exercised for real is the
//! transport: Postfix's SMTP client against the listener, Postfix's queue ids, and delivery of
//! the replies with the null reverse path.
//!
//! Needs root and `/usr/sbin/postfix` (apt `postfix`, in scripts/install-deps.sh): skipped with
//! a reason when missing, failed under `SWITCHBOARD_REQUIRE_MAIL=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::os::unix::fs::PermissionsExt as _;
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
const POSTFIX: &str = "/usr/sbin/postfix";
/// `nobody`: virtual(8) refuses to deliver as a uid under 100.
const MAIL_UID: u32 = 65534;

fn postfix_usable() -> bool {
    let is_root = std::process::Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let has_user = std::fs::read_to_string("/etc/passwd").is_ok_and(|p| p.lines().any(|l| l.starts_with("postfix:")));
    let ok = Path::new(POSTFIX).exists() && is_root && has_user;
    if !ok {
        if std::env::var("SWITCHBOARD_REQUIRE_MAIL").as_deref() == Ok("1") {
            panic!("the Postfix test needs root and {POSTFIX} with its user (apt install postfix)");
        }
        eprintln!("skipped: the Postfix test needs root and {POSTFIX} with its user (apt install postfix)");
    }
    ok
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One Postfix instance with its own configuration, queue and mail directories; stopped on drop.
struct Postfix {
    dir: PathBuf,
    port: u16,
}

impl Postfix {
    /// Starts Postfix on `127.0.0.1:port`, relaying the service address to `asnet_port` and
    /// delivering `alice@example.net` and `bob@example.org` to Maildirs.
    fn start(dir: &Path, asnet_port: u16) -> Self {
        let port = free_port();
        let etc = dir.join("etc");
        for sub in ["etc", "queue", "data", "mail"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        // Postfix's daemons run as `postfix` and `nobody`: they must reach into the tree.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let chown = |path: &Path, owner: &str| {
            let ok = std::process::Command::new("chown").arg(owner).arg(path).status().unwrap();
            assert!(ok.success(), "chown {owner} {}", path.display());
        };
        chown(&dir.join("data"), "postfix");
        chown(&dir.join("mail"), &format!("{MAIL_UID}:{MAIL_UID}"));
        // Debian's master.cf with every service unchrooted (the queue is not a chroot jail) and
        // smtpd on our port only.
        let proto = std::fs::read_to_string("/etc/postfix/master.cf.proto").unwrap();
        let mut master = String::new();
        for line in proto.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if line.starts_with('#') || line.starts_with([' ', '\t']) || fields.len() < 8 {
                master.push_str(line);
            } else if fields[0] == "smtp" && fields[1] == "inet" {
                continue;
            } else {
                let mut f = fields.clone();
                f[4] = "n";
                master.push_str(&f.join("  "));
            }
            master.push('\n');
        }
        master.push_str(&format!("127.0.0.1:{port} inet n - n - - smtpd\n"));
        std::fs::write(etc.join("master.cf"), master).unwrap();
        std::fs::write(etc.join("transport"), format!("{SERVICE} smtp:[127.0.0.1]:{asnet_port}\n")).unwrap();
        std::fs::write(etc.join("vmailbox"), "alice@example.net alice/\nbob@example.org bob/\n").unwrap();
        let d = dir.display();
        std::fs::write(
            etc.join("main.cf"),
            format!(
                "compatibility_level = 3.6\n\
                 queue_directory = {d}/queue\n\
                 data_directory = {d}/data\n\
                 mail_owner = postfix\n\
                 setgid_group = postdrop\n\
                 myhostname = {AUTHSERV}\n\
                 mydomain = example.test\n\
                 myorigin = example.test\n\
                 inet_interfaces = loopback-only\n\
                 inet_protocols = ipv4\n\
                 mynetworks = 127.0.0.0/8\n\
                 mydestination =\n\
                 local_recipient_maps =\n\
                 relayhost =\n\
                 relay_domains = example.test\n\
                 smtpd_relay_restrictions = permit_mynetworks, reject_unauth_destination\n\
                 transport_maps = texthash:{d}/etc/transport\n\
                 virtual_mailbox_domains = example.net example.org\n\
                 virtual_mailbox_base = {d}/mail\n\
                 virtual_mailbox_maps = texthash:{d}/etc/vmailbox\n\
                 virtual_uid_maps = static:{MAIL_UID}\n\
                 virtual_gid_maps = static:{MAIL_UID}\n\
                 default_transport = error:nothing leaves this machine\n\
                 enable_long_queue_ids = yes\n\
                 maillog_file_prefixes = {d}\n\
                 maillog_file = {d}/maillog\n\
                 smtp_dns_support_level = disabled\n\
                 smtpd_peername_lookup = no\n\
                 message_size_limit = 32768\n"
            ),
        )
        .unwrap();
        let out = std::process::Command::new(POSTFIX)
            .args(["-c", etc.to_str().unwrap(), "start"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let this = Self { dir: dir.to_owned(), port };
        assert!(out.status.success(), "postfix start failed; maillog:\n{}", this.maillog());
        this
    }

    fn maillog(&self) -> String {
        std::fs::read_to_string(self.dir.join("maillog")).unwrap_or_default()
    }

    /// The next message in `user`'s Maildir not in `seen`.
    async fn next_mail(&self, user: &str, seen: &mut Vec<PathBuf>) -> (String, Json) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(dir) = std::fs::read_dir(self.dir.join("mail").join(user).join("new")) {
                let mut fresh: Vec<PathBuf> =
                    dir.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| !seen.contains(p)).collect();
                fresh.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
                if let Some(path) = fresh.into_iter().next() {
                    let text = std::fs::read_to_string(&path).unwrap().replace("\r\n", "\n");
                    seen.push(path);
                    let (head, body) = text.split_once("\n\n").unwrap();
                    return (head.to_owned(), serde_json::from_str(body).unwrap());
                }
            }
            assert!(Instant::now() < deadline, "no mail for {user} within 30 s; maillog:\n{}", self.maillog());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Postfix {
    fn drop(&mut self) {
        let _ = std::process::Command::new(POSTFIX)
            .args(["-c", self.dir.join("etc").to_str().unwrap_or_default(), "stop"])
            .stdin(Stdio::null())
            .output();
    }
}

/// A command as an agent would send it, with the header the MTA's DKIM/DMARC milter writes.
fn command_mail(from: &str, body: &Json) -> Vec<u8> {
    let domain = from.rsplit_once('@').unwrap().1;
    format!(
        "Authentication-Results: {AUTHSERV}; spf=pass smtp.mailfrom={from};\r\n\
         \x20dkim=pass header.d={domain} header.b=AbCd; dmarc=pass header.from={domain}\r\n\
         From: {from}\r\n\
         To: {SERVICE}\r\n\
         Subject: asnet\r\n\
         Date: Tue, 01 Dec 2026 20:00:00 +0000\r\n\
         Message-ID: <{}@{domain}>\r\n\
         MIME-Version: 1.0\r\n\
         Content-Type: text/plain; charset=utf-8\r\n\
         \r\n\
         {body}\r\n",
        switchboard_core::util::hex(&switchboard_core::util::random_array::<8>()),
    )
    .into_bytes()
}

async fn send_via_postfix(postfix: &Postfix, from: &str, body: &Json) {
    let transport = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1").port(postfix.port).build();
    let envelope = Envelope::new(Some(from.parse().unwrap()), vec![SERVICE.parse().unwrap()]).unwrap();
    transport.send_raw(&envelope, &command_mail(from, body)).await.unwrap();
}

async fn relay(dir: &Path, asnet_port: u16, postfix_port: u16) -> RunningRelay {
    let mut config = Config::new("127.0.0.1:0".parse().unwrap(), dir.join("relay"));
    config.asnet = Some(AsnetConfig::new(
        Mailbox::parse(SERVICE).unwrap(),
        format!("127.0.0.1:{asnet_port}").parse().unwrap(),
        Smarthost { host: "127.0.0.1".into(), port: postfix_port },
        AUTHSERV.into(),
    ));
    relay_lite::spawn(config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_registers_through_postfix_and_gets_its_replies_delivered_by_postfix() {
    if !postfix_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let asnet_port = free_port();
    let postfix = Postfix::start(&dir.path().join("postfix"), asnet_port);
    let relay = relay(dir.path(), asnet_port, postfix.port).await;
    let alice = "alice@example.net";
    let mut seen = Vec::new();

    let register = json!({"protocol": "ASNET/1", "command": "REGISTER", "discovery": true});
    send_via_postfix(&postfix, alice, &register).await;
    let (head, challenge) = postfix.next_mail("alice", &mut seen).await;
    assert_eq!(challenge["type"], "CHALLENGE");
    assert_eq!(challenge["action"], register);
    // Delivered by Postfix with the null reverse path and the reply's own headers.
    assert!(head.contains("Return-Path: <>"), "{head}");
    assert!(head.contains("Auto-Submitted: auto-generated"), "{head}");
    assert!(head.contains(&format!("X-ASNET-Response-ID: {}", challenge["responseId"].as_str().unwrap())), "{head}");
    // Postfix's SMTP client was answered only after the commit, and said so in its log.
    assert!(postfix.maillog().contains("status=sent (250 2.0.0 Ok: processed)"), "{}", postfix.maillog());

    let verify = json!({"protocol": "ASNET/1", "command": "VERIFY", "challengeId": challenge["challengeId"], "code": challenge["code"]});
    send_via_postfix(&postfix, alice, &verify).await;
    let (_, registered) = postfix.next_mail("alice", &mut seen).await;
    assert_eq!(registered["type"], "REGISTERED");
    let member = registered["memberId"].as_str().unwrap();
    assert_eq!(registered["marker"], format!("agent-society:v1:{member}"));

    // A mail without a DKIM pass is accepted by the listener and dropped: no bounce, no reply.
    let no_dkim = String::from_utf8(command_mail(alice, &register)).unwrap().replace("dkim=pass", "dkim=fail");
    let transport = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1").port(postfix.port).build();
    let envelope = Envelope::new(Some(alice.parse().unwrap()), vec![SERVICE.parse().unwrap()]).unwrap();
    transport.send_raw(&envelope, no_dkim.as_bytes()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !postfix.maillog().contains("Dropped: DKIM did not pass") {
        assert!(Instant::now() < deadline, "{}", postfix.maillog());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mails = std::fs::read_dir(dir.path().join("postfix/mail/alice/new")).unwrap().count();
    assert_eq!(mails, 2, "the refused mail drew no reply and no bounce");
    relay.shutdown().await.unwrap();
}
