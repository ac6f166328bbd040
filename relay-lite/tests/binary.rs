//! The `relay-lite` binary: its one listening line, TLS with a pinned self-signed certificate,
//! the refusal of plain HTTP off loopback, and the JSON config file.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;

use std::time::Duration;

use common::{alice, http_client, small_envelope, start_binary};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use switchboard_core::protocol::letagents::wire::ErrorBody;
use switchboard_core::util::{hex, sha256};

#[tokio::test]
async fn binary_prints_one_listening_line_and_serves_plain_http_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let relay = start_binary(&["--listen", "127.0.0.1:0", "--data", data], http_client()).await;
    assert!(relay.preamble.is_empty(), "unexpected output: {:?}", relay.preamble);
    assert_eq!(relay.scheme, "http");
    assert_ne!(relay.addr.port(), 0);
    let alice = alice();
    relay.inbox(&alice).await;
    assert_eq!(relay.send(&alice, small_envelope("hi")).await, 202);
}

#[tokio::test]
async fn binary_refuses_plain_http_on_a_non_loopback_address() {
    let dir = tempfile::tempdir().unwrap();
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_relay-lite"))
            .args(["--listen", "0.0.0.0:0", "--data", dir.path().to_str().unwrap()])
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "it must not claim to listen");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("refusing plain HTTP"), "{stderr}");
}

#[tokio::test]
async fn binary_on_every_interface_needs_a_public_url_to_name_itself() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_relay-lite"))
            .args(["--listen", "0.0.0.0:0", "--data", data, "--tls-self-signed"])
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "it must not claim to listen");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--public-url"), "{stderr}");
    // A URL that is not a bare origin is refused with its reason.
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_relay-lite"))
        .args(["--listen", "127.0.0.1:0", "--data", data, "--public-url", "https://relay.example/inbox"])
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("bare origin"));
}

#[tokio::test]
async fn self_signed_tls_prints_the_fingerprint_and_keeps_the_certificate_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let args = ["--listen", "127.0.0.1:0", "--data", data, "--tls-self-signed"];

    let mut first = start_binary(&args, http_client()).await;
    assert_eq!(first.scheme, "https");
    let [line] = first.preamble.as_slice() else { panic!("preamble {:?}", first.preamble) };
    let fingerprint = line.strip_prefix("certificate sha256 ").unwrap().to_owned();
    let pem = std::fs::read(dir.path().join(relay_lite::tls::SELF_SIGNED_CERT)).unwrap();
    let der = CertificateDer::from_pem_slice(&pem).unwrap();
    assert_eq!(fingerprint, hex(&sha256(der.as_ref())));

    // A client that trusts exactly this certificate talks to it over HTTPS.
    let pinned =
        reqwest::Client::builder().tls_certs_only([reqwest::Certificate::from_pem(&pem).unwrap()]).build().unwrap();
    let response = pinned.get(first.url("/v1/nothing")).send().await.unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(response.json::<ErrorBody>().await.unwrap().error, "not_found");
    first.child.kill().await.unwrap();

    let second = start_binary(&args, http_client()).await;
    assert_eq!(second.preamble, vec![format!("certificate sha256 {fingerprint}")]);
}

#[tokio::test]
async fn config_file_supplies_the_settings_and_flags_override_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("relay.json");
    let json = serde_json::json!({
        "listen": "127.0.0.1:0",
        "data": dir.path().join("data"),
        "sends-per-minute": 1,
        "mailbox-capacity": 1,
    });
    std::fs::write(&config, json.to_string()).unwrap();
    let relay = start_binary(&["--config", config.to_str().unwrap(), "--mailbox-capacity", "5"], http_client()).await;
    assert!(dir.path().join("data").join(relay_lite::store::DB_FILE).exists());
    let alice = alice();
    relay.inbox(&alice).await;
    assert_eq!(relay.send(&alice, small_envelope("1")).await, 202);
    // From the file: one send a minute. (Capacity 1 from the file would have said 507.)
    assert_eq!(relay.send(&alice, small_envelope("2")).await, 429);
}

#[tokio::test]
async fn given_certificate_files_are_served_and_fingerprinted() {
    let dir = tempfile::tempdir().unwrap();
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    let data = dir.path().join("data");
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--data",
        data.to_str().unwrap(),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    let pinned = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(made.cert.pem().as_bytes()).unwrap()])
        .build()
        .unwrap();
    let relay = start_binary(&args, pinned).await;
    let fingerprint = hex(&sha256(made.cert.der()));
    assert_eq!(relay.preamble, vec![format!("certificate sha256 {fingerprint}")]);
    let alice = alice();
    relay.inbox(&alice).await;
    assert_eq!(relay.send(&alice, small_envelope("over tls")).await, 202);
}

#[tokio::test]
async fn binary_exits_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let mut relay = start_binary(&["--listen", "127.0.0.1:0", "--data", data], http_client()).await;
    let pid = relay.child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(10), relay.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status:?}");
}
