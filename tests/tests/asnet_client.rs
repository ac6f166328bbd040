//! The ASNET/1 client end to end, over real mail on loopback: two profiles register, verify,
//! connect, accept with a subset of the scopes, list and disconnect, every `VERIFY` approved by
//! the owner: through `switchboard review approve`, and once (the connect Alice's agent asked
//! for through its session) in the browser UI, headless Chromium (`ui/e2e/asnet_approve.e2e.mjs`).
//!
//! The chain (nothing can leave the machine):
//! - each profile sends its command mail by SMTP to Debian's Postfix (smtpd on 127.0.0.1, no
//!   auth: loopback is in `mynetworks`);
//! - Postfix relays the service address to relay-lite's ASNET SMTP listener (`transport_maps`);
//!   its queue id in the topmost `Received:` is the delivery id. There is no DNS here, so no
//!   DKIM/DMARC milter can verify anything: a Postfix `header_checks` rule writes the
//!   `Authentication-Results` header such a milter would write, for mail from loopback;
//! - relay-lite sends its replies to Postfix as smarthost, which delivers them with virtual(8)
//!   into per-user Maildirs;
//! - Debian's Dovecot (dovecot-imapd) serves those Maildirs over IMAP on 127.0.0.1 (plain login
//!   over loopback), and each profile reads its replies from there.
//!
//! Needs root, Postfix and Dovecot (scripts/install-deps.sh): skipped with a reason when missing,
//! failed under `SWITCHBOARD_REQUIRE_MAIL=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lettre::address::Envelope;
use lettre::{AsyncSmtpTransport, AsyncTransport as _, Tokio1Executor};
use relay_lite::asnet::{AsnetConfig, Smarthost};
use relay_lite::{Config, RunningRelay};
use serde_json::{Value, json};
use switchboard_core::protocol::asnet::Mailbox;
use switchboard_tests::browser::{Driver, require_browser, run_scenario, serve_ui_with};
use switchboard_tests::{bridge_of, open_session};

const SERVICE: &str = "network@example.test";
const AUTHSERV: &str = "mx.example.test";
const POSTFIX: &str = "/usr/sbin/postfix";
const DOVECOT: &str = "/usr/sbin/dovecot";
/// `nobody`: virtual(8) delivers and Dovecot reads as this user.
const MAIL_UID: u32 = 65534;
const ALICE: &str = "alice@example.net";
const BOB: &str = "bob@example.org";
const PASSWORD: &str = "correct horse battery staple";

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

fn mail_usable() -> bool {
    let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let users = ["postfix:", "dovecot:", "dovenull:"].iter().all(|u| passwd.lines().any(|l| l.starts_with(u)));
    let ok = Path::new(POSTFIX).exists() && Path::new(DOVECOT).exists() && is_root && users;
    if !ok {
        let why = "the ASNET client test needs root, Postfix and Dovecot with their users (apt install postfix dovecot-imapd)";
        if std::env::var("SWITCHBOARD_REQUIRE_MAIL").as_deref() == Ok("1") {
            panic!("{why}");
        }
        eprintln!("skipped: {why}");
    }
    ok
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn chown(path: &Path, owner: &str) {
    let ok = Command::new("chown").arg(owner).arg(path).status().unwrap();
    assert!(ok.success(), "chown {owner} {}", path.display());
}

/// Postfix and Dovecot over one tree of Maildirs; both stopped on drop.
struct MailServers {
    dir: PathBuf,
    smtp_port: u16,
    imap_port: u16,
}

impl MailServers {
    fn start(dir: &Path, asnet_port: u16) -> Self {
        let smtp_port = free_port();
        let imap_port = free_port();
        for sub in ["etc", "queue", "data", "mail", "dovecot/run", "dovecot/etc"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        // The daemons run as `postfix`, `nobody` and `dovecot`: they must reach into the tree.
        let mut p = dir.to_owned();
        while p.parent().is_some() && p != Path::new("/tmp") {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).ok();
            if !p.pop() {
                break;
            }
        }
        chown(&dir.join("data"), "postfix");
        chown(&dir.join("mail"), &format!("{MAIL_UID}:{MAIL_UID}"));
        let d = dir.display();

        // Postfix: Debian's master.cf unchrooted, smtpd on our port only.
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
        master.push_str(&format!("127.0.0.1:{smtp_port} inet n - n - - smtpd\n"));
        std::fs::write(dir.join("etc/master.cf"), master).unwrap();
        std::fs::write(dir.join("etc/transport"), format!("{SERVICE} smtp:[127.0.0.1]:{asnet_port}\n")).unwrap();
        std::fs::write(dir.join("etc/vmailbox"), format!("{ALICE} alice/\n{BOB} bob/\n")).unwrap();
        // What a DKIM/DMARC milter would write for mail it verified (there is no DNS to verify
        // against here); only mail received from loopback passes through this Postfix at all.
        std::fs::write(
            dir.join("etc/header_checks"),
            format!(
                "/^From:.*@([-a-z0-9.]+)>?[[:space:]]*$/ PREPEND Authentication-Results: {AUTHSERV}; \
                 spf=pass smtp.mailfrom=$1; dkim=pass header.d=$1; dmarc=pass header.from=$1\n"
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("etc/main.cf"),
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
                 header_checks = regexp:{d}/etc/header_checks\n\
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
                 message_size_limit = 65536\n"
            ),
        )
        .unwrap();

        // Dovecot: IMAP only, on loopback, plain login allowed (loopback), the same Maildirs.
        std::fs::write(
            dir.join("dovecot/etc/passwd"),
            format!("{ALICE}:{{PLAIN}}{PASSWORD}\n{BOB}:{{PLAIN}}{PASSWORD}\n"),
        )
        .unwrap();
        std::fs::write(
            dir.join("dovecot/etc/dovecot.conf"),
            format!(
                "protocols = imap\n\
                 listen = 127.0.0.1\n\
                 base_dir = {d}/dovecot/run\n\
                 state_dir = {d}/dovecot/run\n\
                 log_path = {d}/dovecot/dovecot.log\n\
                 ssl = no\n\
                 disable_plaintext_auth = no\n\
                 auth_mechanisms = plain login\n\
                 mail_location = maildir:{d}/mail/%n\n\
                 first_valid_uid = 100\n\
                 passdb {{\n  driver = passwd-file\n  args = scheme=PLAIN username_format=%u {d}/dovecot/etc/passwd\n}}\n\
                 userdb {{\n  driver = static\n  args = uid={MAIL_UID} gid={MAIL_UID} home={d}/mail/%n\n}}\n\
                 service imap-login {{\n  inet_listener imap {{\n    address = 127.0.0.1\n    port = {imap_port}\n  }}\n  \
                 inet_listener imaps {{\n    port = 0\n  }}\n}}\n\
                 service stats {{\n  unix_listener stats-reader {{\n    mode = 0666\n  }}\n  unix_listener stats-writer {{\n    mode = 0666\n  }}\n}}\n"
            ),
        )
        .unwrap();

        let this = Self { dir: dir.to_owned(), smtp_port, imap_port };
        let out = Command::new(POSTFIX)
            .args(["-c", dir.join("etc").to_str().unwrap(), "start"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "postfix start failed; maillog:\n{}", this.log("maillog"));
        // Not `output()`: the daemon keeps the pipes open, so only the exit status is waited for.
        let status = Command::new(DOVECOT)
            .args(["-c", dir.join("dovecot/etc/dovecot.conf").to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "dovecot failed:\n{}", this.log("dovecot/dovecot.log"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", imap_port)).is_err() {
            assert!(Instant::now() < deadline, "dovecot did not listen:\n{}", this.log("dovecot/dovecot.log"));
            std::thread::sleep(Duration::from_millis(50));
        }
        this
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    fn logs(&self) -> String {
        format!("maillog:\n{}\ndovecot:\n{}", self.log("maillog"), self.log("dovecot/dovecot.log"))
    }

    /// Every mail delivered to `user` so far (Maildir new/ and cur/).
    fn mails(&self, user: &str) -> Vec<String> {
        let mut out = Vec::new();
        for sub in ["new", "cur"] {
            if let Ok(dir) = std::fs::read_dir(self.dir.join("mail").join(user).join(sub)) {
                for e in dir.flatten() {
                    out.push(std::fs::read_to_string(e.path()).unwrap_or_default());
                }
            }
        }
        out
    }

    async fn send(&self, from: &str, to: &str, raw: &str) {
        let transport =
            AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1").port(self.smtp_port).build();
        let envelope = Envelope::new(Some(from.parse().unwrap()), vec![to.parse().unwrap()]).unwrap();
        transport.send_raw(&envelope, raw.as_bytes()).await.unwrap();
    }
}

impl Drop for MailServers {
    fn drop(&mut self) {
        let _ = Command::new(POSTFIX)
            .args(["-c", self.dir.join("etc").to_str().unwrap_or_default(), "stop"])
            .stdin(Stdio::null())
            .output();
        let _ = Command::new(DOVECOT)
            .args(["-c", self.dir.join("dovecot/etc/dovecot.conf").to_str().unwrap_or_default(), "stop"])
            .stdin(Stdio::null())
            .output();
    }
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

/// The browser scenario asks the test nothing.
struct NoRequests;

impl Driver for NoRequests {
    async fn handle(&mut self, req: &Value) -> Result<Value, String> {
        Err(format!("unexpected request {req}"))
    }
}

/// One profile driven through the `switchboard` command line.
struct Profile {
    home: PathBuf,
    name: &'static str,
}

impl Profile {
    fn run(&self, args: &[&str]) -> Value {
        eprintln!("{}: {args:?}", self.name);
        let out = Command::new(bin())
            .arg("--home")
            .arg(&self.home)
            .args(args)
            .arg("--json")
            .env("SWITCHBOARD_KEYSTORE", "file")
            .env("SWITCHBOARD_ASNET_PASSWORD", PASSWORD)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{} {args:?} failed: {}{stdout}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{} {args:?} printed {stdout:?}: {e}", self.name))
    }

    fn status(&self) -> Value {
        self.run(&["asnet", "status"])
    }

    /// Reads the mailbox until `ok` holds for the status, or fails after 60 s.
    fn until(&self, servers: &MailServers, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.status();
            if ok(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "{}: no {what} within 60 s; status {s:#}\n{}",
                self.name,
                servers.logs()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Waits for the challenge of `action`, checks it is in `review list` with that exact
    /// action, and approves it as the owner.
    fn approve(&self, servers: &MailServers, action: &Value) {
        self.until(servers, "challenge", |s| {
            s["challenges"].as_array().unwrap().iter().any(|c| c["state"] == "pending" && c["action"] == *action)
        });
        let list = self.run(&["review", "list"]);
        let item = list
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["asnet"]["action"] == *action)
            .unwrap_or_else(|| panic!("{}: no review item for {action} in {list:#}", self.name))
            .clone();
        assert_eq!(item["kind"], "asnet_verify");
        let approved = self.run(&["review", "approve", &item["id"].to_string()]);
        assert_eq!(approved["sent"], "VERIFY", "{approved}");
        assert_eq!(approved["action"], *action);
    }
}

fn setup(bin_home: &Path, name: &'static str, mailbox: &str, relay_url: &str, servers: &MailServers) -> Profile {
    let p = Profile { home: bin_home.to_owned(), name };
    p.run(&["init", "--name", name, "--relay", relay_url]);
    let v = p.run(&[
        "asnet",
        "setup",
        "--service",
        SERVICE,
        "--mailbox",
        mailbox,
        "--smtp",
        &format!("127.0.0.1:{}", servers.smtp_port),
        "--smtp-tls",
        "none",
        "--smtp-auth",
        "false",
        "--imap",
        &format!("127.0.0.1:{}", servers.imap_port),
        "--imap-tls",
        "none",
    ]);
    assert_eq!(v["mailbox"], mailbox);
    // The password is in the keystore file, not in the database.
    let db = std::fs::read(p.home.join("switchboard.db")).unwrap_or_default();
    assert!(!db.windows(PASSWORD.len()).any(|w| w == PASSWORD.as_bytes()), "the password reached the database");
    p
}

fn register(p: &Profile, servers: &MailServers, discovery: bool) -> String {
    p.run(&["asnet", "register", "--discovery", if discovery { "true" } else { "false" }]);
    p.approve(servers, &json!({"protocol": "ASNET/1", "command": "REGISTER", "discovery": discovery}));
    let s = p.until(servers, "member id", |s| s["member_id"].is_string());
    assert_eq!(s["discovery"], discovery);
    s["member_id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_profiles_register_connect_accept_fewer_scopes_list_and_disconnect_over_real_mail() {
    if !mail_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let asnet_port = free_port();
    let servers = MailServers::start(&dir.path().join("mail"), asnet_port);
    eprintln!("mail servers up");
    let relay = relay(dir.path(), asnet_port, servers.smtp_port).await;
    eprintln!("relay up at {}", relay.addr);
    let relay_url = format!("http://{}", relay.addr);
    let alice = setup(&dir.path().join("alice"), "alice", ALICE, &relay_url, &servers);
    let bob = setup(&dir.path().join("bob"), "bob", BOB, &relay_url, &servers);

    let alice_id = register(&alice, &servers, true);
    let bob_id = register(&bob, &servers, false);
    assert_ne!(alice_id, bob_id);

    // Alice's agent proposes both scopes (the MCP tools' path: an agent session on the bridge of
    // her runtime, here the `switchboard ui` process her browser uses). Setting up or registering
    // the account is refused to it; the connect goes out, and the review item names the agent:
    // only Alice's approval, given in the browser, sends VERIFY.
    // Her runtime polls the mailbox only every 10 minutes here: the challenge reaches the review
    // queue in time only because IMAP IDLE wakes the runtime when the service's mail lands.
    require_browser();
    let (mut ui, ui_url) = serve_ui_with(&bin(), &alice.home, &[("SWITCHBOARD_ASNET_POLL_MS", "600000")]).await;
    let (url, _, owner) = bridge_of(&alice.home);
    let http = reqwest::Client::new();
    let scout = open_session(&http, &url, &owner, "scout").await;
    let agent = |body: Value| {
        let (http, url, scout) = (http.clone(), url.clone(), scout.clone());
        async move {
            let r = http.post(&url).bearer_auth(&scout).json(&body).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, refused) = agent(json!({"op": "asnet_register", "discovery": true})).await;
    assert_eq!((status, refused["code"].as_str()), (403, Some("forbidden")), "{refused}");
    let (status, asked) =
        agent(json!({"op": "asnet_connect", "member_id": bob_id, "scopes": ["contact:email", "profile:basic"]})).await;
    assert_eq!(status, 200, "{asked}");
    run_scenario(
        "asnet_approve.e2e.mjs",
        &ui_url,
        &[("BOB_MEMBER", bob_id.clone())],
        "asnet-e2e",
        Duration::from_secs(120),
        &mut NoRequests,
    )
    .await;
    let (status, seen) = agent(json!({"op": "asnet_status"})).await;
    assert_eq!(status, 200, "{seen}");
    let connect = seen["requests"].as_array().unwrap().iter().find(|r| r["action"]["command"] == "CONNECT").cloned();
    let connect = connect.unwrap_or_else(|| panic!("no CONNECT request: {seen}"));
    assert_eq!((connect["requested_by"].as_str(), connect["state"].as_str()), (Some("scout"), Some("verified")));
    ui.start_kill().unwrap();
    ui.wait().await.unwrap();
    let s = bob.until(&servers, "invitation", |s| !s["invitations"].as_array().unwrap().is_empty());
    let invitation = s["invitations"][0].clone();
    assert_eq!(invitation["from_member_id"], alice_id);
    assert_eq!(invitation["scopes"], json!(["contact:email", "profile:basic"]));
    let request = invitation["request_id"].as_str().unwrap().to_owned();
    // More than the offer is refused locally, before any mail.
    let out = Command::new(bin())
        .arg("--home")
        .arg(&bob.home)
        .args(["asnet", "accept", &request, "--scopes", "contact:email,profile:basic,profile:basic"])
        .env("SWITCHBOARD_KEYSTORE", "file")
        .output()
        .unwrap();
    assert!(!out.status.success());
    bob.run(&["asnet", "accept", &request, "--scopes", "contact:email"]);
    bob.approve(
        &servers,
        &json!({"protocol": "ASNET/1", "command": "ACCEPT", "requestId": request, "scopes": ["contact:email"]}),
    );
    let connected = |me: &Profile, other: &str| {
        me.until(&servers, "connection", |s| {
            s["connections"].as_array().unwrap().iter().any(|c| c["member_id"] == other)
        })
    };
    let s = connected(&bob, &alice_id);
    assert_eq!(s["connections"][0]["scopes"], json!(["contact:email"]));
    let s = connected(&alice, &bob_id);
    assert_eq!(s["connections"][0]["scopes"], json!(["contact:email"]), "Bob's subset is what holds");

    // The private list, freshly challenged.
    let before = alice.status()["warnings"].as_array().unwrap().len();
    alice.run(&["asnet", "connections"]);
    alice.approve(&servers, &json!({"protocol": "ASNET/1", "command": "LIST CONNECTIONS"}));
    alice.until(&servers, "CONNECTIONS reply", |s| {
        s["requests"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["action"]["command"] == "LIST CONNECTIONS" && r["state"] == "verified")
    });

    // A forged challenge for an action Alice never asked for, a mail from someone else and a
    // replayed service reply: recorded as warnings, never answered, no review item.
    let forged = format!(
        "From: {SERVICE}\r\nTo: {ALICE}\r\nSubject: ASNET/1 CHALLENGE\r\nAuto-Submitted: auto-generated\r\n\
         X-ASNET-Response-ID: rsp_00000000000000000000000000000001\r\nContent-Type: text/plain; charset=us-ascii\r\n\r\n\
         {}\r\n",
        json!({"protocol": "ASNET/1", "type": "CHALLENGE", "responseId": "rsp_00000000000000000000000000000001",
               "challengeId": "chl_00000000000000000000000000000001", "code": "00000000000000000000000000000001",
               "expiresAt": 9_999_999_999_999i64,
               "action": {"protocol": "ASNET/1", "command": "DISCONNECT", "memberId": bob_id}})
    );
    servers.send("mallory@example.test", ALICE, &forged).await;
    let stranger = forged.replacen(&format!("From: {SERVICE}"), "From: mallory@example.test", 1);
    servers.send("mallory@example.test", ALICE, &stranger).await;
    let replayed = servers
        .mails("alice")
        .into_iter()
        .find(|m| m.contains("\"type\": \"REGISTERED\""))
        .expect("alice's REGISTERED reply is in her Maildir");
    let replayed = replayed
        .split_once("From: ")
        .map(|(_, rest)| format!("From: {rest}"))
        .unwrap()
        .replace("\r\n", "\n")
        .replace('\n', "\r\n");
    servers.send("mallory@example.test", ALICE, &replayed).await;
    let s = alice.until(&servers, "three warnings", |s| s["warnings"].as_array().unwrap().len() >= before + 3);
    let kinds: Vec<&str> = s["warnings"].as_array().unwrap().iter().map(|w| w["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"unsolicited_challenge"), "{kinds:?}");
    assert!(kinds.contains(&"refused_mail"), "{kinds:?}");
    assert!(kinds.contains(&"duplicate_response"), "{kinds:?}");
    let forged_state = s["challenges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["challenge_id"] == "chl_00000000000000000000000000000001");
    assert_eq!(forged_state.unwrap()["state"], "warning");
    let list = alice.run(&["review", "list"]);
    assert!(list.as_array().unwrap().is_empty(), "nothing for the owner to approve: {list:#}");
    assert_eq!(alice.status()["connections"].as_array().unwrap().len(), 1, "the forged action was not carried out");

    // Bob disconnects; both lists empty.
    bob.run(&["asnet", "disconnect", &alice_id]);
    bob.approve(&servers, &json!({"protocol": "ASNET/1", "command": "DISCONNECT", "memberId": alice_id}));
    bob.until(&servers, "empty list", |s| s["connections"].as_array().unwrap().is_empty());
    alice.until(&servers, "empty list", |s| s["connections"].as_array().unwrap().is_empty());

    // Nothing ever left for a non-local destination.
    assert!(!servers.log("maillog").contains("status=bounced"), "{}", servers.logs());
    relay.shutdown().await.unwrap();
}
