//! A Switchboard profile and the PUBLISHED Agent Mail SDK (PyPI `agent-protocols`, its
//! `MailClient`) through relay-lite over HTTPS on loopback (relay-lite's self-signed certificate,
//! trusted by both sides, verification on): the SDK publishes a card and sends; the SDK's packet
//! verifies and opens in our code; Switchboard pins the SDK's card by address and replies; the
//! SDK decrypts the reply and checks its bindings.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use switchboard_core::api::Request;
use switchboard_core::protocol::agent_mail::recipient::verify;
use switchboard_core::protocol::agent_mail::{MailAddress, Packet};
use switchboard_core::util::now_ms;
use switchboard_tests::{Peer, TestRelay};

/// Reads the next line starting with `tag ` from the script.
fn expect_line(lines: &mut impl Iterator<Item = std::io::Result<String>>, tag: &str) -> String {
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix(&format!("{tag} ")) {
            return rest.to_owned();
        }
    }
    panic!("the script ended before printing {tag}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_protocols_sdk_and_a_switchboard_profile_exchange_mail() {
    let import = Command::new("python3").args(["-c", "import agent_protocols.http_client"]).status().unwrap();
    assert!(import.success(), "the `agent-protocols` Python package is missing: run scripts/install-deps.sh");

    let relay = TestRelay::start_tls().await;
    let origin = relay.url();
    assert!(origin.starts_with("https://"));
    let cert = relay.dir.path().join("tls/self-signed.cert.pem");
    let mut bob = Peer::offline_pinned("bob", &origin, relay.cert_sha256.as_deref()).await;
    bob.go_live();
    let bob_address = bob.call(Request::Whoami).await["agent_mail"]["address"].as_str().unwrap().to_owned();

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/interop/agent_mail_peer.py");
    let mut child = Command::new("python3")
        .args([script, &origin, cert.to_str().unwrap(), &bob_address])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let first = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        let address = expect_line(&mut lines, "ADDRESS");
        let packet = expect_line(&mut lines, "PACKET");
        let message = expect_line(&mut lines, "MESSAGE");
        (address, packet, message, lines)
    });
    let (py_address, py_packet, py_message, lines) = first.await.unwrap();
    let py = MailAddress::parse(&py_address).unwrap();
    let (message_id, thread_id) = py_message.split_once(' ').unwrap();

    // The SDK's packet passes our strict parse and the recipient's pre-decryption checks.
    let packet = Packet::parse(py_packet.as_bytes()).unwrap();
    assert_eq!(*packet.sender(), py.owner);
    let verified = verify(py_packet.as_bytes(), Some(&packet.id()), now_ms()).unwrap();
    assert_eq!(*verified.sender(), py.owner);

    // It arrives as a stranger's request; adding the SDK's address fetches, verifies and pins the
    // card the SDK published, and accepts the request.
    let sender = py.owner.to_string();
    let mut arrived = false;
    for _ in 0..300 {
        let reqs = bob.call(Request::ContactRequests).await;
        if reqs.as_array().unwrap().iter().any(|r| r["id"] == sender.as_str()) {
            arrived = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(arrived, "the SDK's message never arrived as a request");
    let contact = bob
        .call(Request::ContactAdd {
            address: py_address.clone(),
            name: Some("pyagent".into()),
            allow: None,
            relay: None,
            no_hello: false,
        })
        .await;
    assert_eq!(contact["state"], "active");
    let got = bob.inbox(10).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["body"], "hello from the agent-protocols SDK");
    assert_eq!(got[0]["from"], "pyagent");
    assert_eq!(got[0]["id"], message_id);
    assert_eq!(got[0]["thread"], thread_id);
    assert_eq!(got[0]["subject"], "interop");

    bob.call(Request::Send {
        contact: "pyagent".into(),
        text: "hello SDK, this is switchboard".into(),
        kind: Some("reply".into()),
        reply_to: Some(message_id.to_owned()),
        from_agent: None,
        to_agent: None,
    })
    .await;
    let rest = tokio::task::spawn_blocking(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let status = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    let rest = rest.await.unwrap();
    assert!(status.status.success(), "python failed: {}", String::from_utf8_lossy(&status.stderr));
    assert!(rest.iter().any(|l| l == "REPLY hello SDK, this is switchboard"), "{rest:?}");
    assert!(rest.iter().any(|l| l == "SUBJECT Re: interop"), "{rest:?}");
}
