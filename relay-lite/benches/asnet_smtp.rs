//! ASNET/1 commands through relay-lite's SMTP listener on loopback, against a bare SMTP receive
//! of the same mails in the same run (alternating rounds, medians).
//!
//! - ASNET: `ASNET_BENCH_CLIENTS` (8) SMTP sessions each send their share of `ASNET_BENCH_MAILS`
//!   (2,000) `LOOKUP` mails as the trusted MTA would (topmost `Received:` with a fresh queue id,
//!   passing `Authentication-Results`), one transaction after another on one connection. Each
//!   `250` means: read with the 32 KiB limit, the MIME adapter, the strict command codec, the
//!   core's dedup and budget checks, one SQLite transaction (WAL, `synchronous=FULL`) holding the
//!   delivery id, the attempt and the queued reply, committed. Senders are distinct so the
//!   per-sender budget never refuses; the global budget is raised out of the way. Replies go to a
//!   closed port (the dispatcher's pace is not what is measured).
//! - Baseline: the same SMTP server code with a receiver that accepts each message and does
//!   nothing, same clients and mails.
//!
//! `cargo bench -p relay-lite --bench asnet_smtp`; `ASNET_BENCH_ROUNDS` (3).

// A bench, not library code: a failed setup or a wrong answer should stop the run loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use relay_lite::Config;
use relay_lite::asnet::smtp::{Deliver, Reply, Session, Timeouts, serve_connection};
use relay_lite::asnet::{AsnetConfig, Smarthost};
use support::{env_or, median};
use switchboard_core::protocol::asnet::Mailbox;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};

const SERVICE: &str = "network@example.test";
const AUTHSERV: &str = "mx.example.test";

fn mail(round: usize, i: usize) -> (String, Vec<u8>) {
    let from = format!("agent{i}@example.net");
    let raw = format!(
        "Received: from mail.example.net (mail.example.net [198.18.0.2])\r\n\
         \tby {AUTHSERV} (Postfix) with ESMTPS id 4Qr{round}x{i}\r\n\
         \tfor <{SERVICE}>; Tue, 01 Dec 2026 20:00:00 +0000 (UTC)\r\n\
         Authentication-Results: {AUTHSERV}; spf=pass smtp.mailfrom={from};\r\n\
         \x20dkim=pass header.d=example.net header.b=AbCd; dmarc=pass header.from=example.net\r\n\
         From: {from}\r\n\
         To: {SERVICE}\r\n\
         Subject: asnet\r\n\
         Content-Type: text/plain; charset=utf-8\r\n\
         \r\n\
         {{\"protocol\":\"ASNET/1\",\"command\":\"LOOKUP\",\"memberId\":\"mem_0123456789abcdef0123456789abcdef\"}}\r\n"
    );
    (from, raw.into_bytes())
}

/// Reads one (possibly multi-line) reply; returns its code and last line.
async fn reply(r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> (u16, String) {
    let mut line = String::new();
    loop {
        line.clear();
        r.read_line(&mut line).await.unwrap();
        if line.as_bytes().get(3) != Some(&b'-') {
            return (line[..3].parse().unwrap(), line.trim_end().to_owned());
        }
    }
}

/// One client session sending `mails` in turn; every one must be answered `expect`.
async fn client(addr: SocketAddr, mails: Vec<(String, Vec<u8>)>, expect: &'static str) {
    let stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    assert_eq!(reply(&mut read).await.0, 220);
    write.write_all(b"EHLO mx.example.test\r\n").await.unwrap();
    assert_eq!(reply(&mut read).await.0, 250);
    for (from, raw) in mails {
        // Pipelined envelope, as Postfix sends it.
        write.write_all(format!("MAIL FROM:<{from}>\r\nRCPT TO:<{SERVICE}>\r\nDATA\r\n").as_bytes()).await.unwrap();
        assert_eq!(reply(&mut read).await.0, 250);
        assert_eq!(reply(&mut read).await.0, 250);
        assert_eq!(reply(&mut read).await.0, 354);
        write.write_all(&raw).await.unwrap();
        write.write_all(b".\r\n").await.unwrap();
        let (code, text) = reply(&mut read).await;
        assert_eq!(code, 250, "{text}");
        assert!(text.contains(expect), "{text}");
    }
    write.write_all(b"QUIT\r\n").await.unwrap();
}

async fn run(addr: SocketAddr, round: usize, mails: usize, clients: usize, expect: &'static str) -> f64 {
    let mut shares: Vec<Vec<(String, Vec<u8>)>> = vec![Vec::new(); clients];
    for i in 0..mails {
        shares[i % clients].push(mail(round, i));
    }
    let started = Instant::now();
    let tasks: Vec<_> = shares.into_iter().map(|s| tokio::spawn(client(addr, s, expect))).collect();
    for t in tasks {
        t.await.unwrap();
    }
    mails as f64 / started.elapsed().as_secs_f64()
}

struct Discard;

impl Deliver for Discard {
    async fn deliver(&self, _from: String, _to: String, _raw: Vec<u8>) -> Reply {
        Reply::new(250, "2.0.0 Ok: discarded")
    }
}

async fn bare_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = Mailbox::parse(SERVICE).unwrap();
    tokio::spawn(async move {
        let discard = Arc::new(Discard);
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            stream.set_nodelay(true).unwrap();
            let session = Session::new(service.clone(), "bare.test");
            let discard = discard.clone();
            tokio::spawn(async move {
                let _ = serve_connection(stream, session, Timeouts::default(), discard.as_ref()).await;
            });
        }
    });
    addr
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let mails: usize = env_or("ASNET_BENCH_MAILS", 2000);
    let clients: usize = env_or("ASNET_BENCH_CLIENTS", 8);
    let rounds: usize = env_or("ASNET_BENCH_ROUNDS", 3);
    let dir = tempfile::tempdir().unwrap();
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut config = Config::new("127.0.0.1:0".parse().unwrap(), dir.path());
    let mut asnet = AsnetConfig::new(
        Mailbox::parse(SERVICE).unwrap(),
        "127.0.0.1:0".parse().unwrap(),
        Smarthost { host: "127.0.0.1".into(), port: closed_port },
        AUTHSERV.into(),
    );
    asnet.limits.global = u32::MAX;
    config.asnet = Some(asnet);
    let relay = relay_lite::spawn(config).await.unwrap();
    let asnet_addr = relay.asnet.as_ref().unwrap().smtp_addr;
    let bare_addr = bare_server().await;

    let (mut asnet_rates, mut bare_rates) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        bare_rates.push(run(bare_addr, round, mails, clients, "discarded").await);
        asnet_rates.push(run(asnet_addr, round, mails, clients, "processed").await);
        println!("round {round}: asnet {:.0} mails/s, bare SMTP {:.0} mails/s", asnet_rates[round], bare_rates[round]);
    }
    let (a, b) = (median(&asnet_rates), median(&bare_rates));
    println!(
        "asnet_smtp: {mails} LOOKUP mails over {clients} sessions, median of {rounds}: ASNET {a:.0}/s, bare SMTP receive {b:.0}/s ({:.1}%)",
        100.0 * a / b
    );
    relay.shutdown().await.unwrap();
}
