//! A Switchboard profile and the PUBLISHED Stringcup reference client (PyPI `stringcup`) talking
//! through relay-lite: the Python client encrypts what our runtime decrypts, and the reverse.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use switchboard_core::api::Request;
use switchboard_tests::{Peer, TestRelay};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_python_client_and_a_switchboard_profile_talk() {
    let import = Command::new("python3").args(["-c", "import stringcup"]).status().unwrap();
    assert!(import.success(), "the `stringcup` Python package is missing: run scripts/install-deps.sh");

    let relay = TestRelay::start().await;
    let bob = Peer::live("bob", &relay.url()).await;
    let bob_id = bob.call(Request::Whoami).await["stringcup"]["id"].as_str().unwrap().to_owned();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/interop/stringcup_peer.py");
    let mut child = Command::new("python3")
        .args([script, &format!("{}/api/v2", relay.url()), &bob_id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::task::spawn_blocking(move || {
        let l = lines.next().unwrap().unwrap();
        (l, lines)
    });
    let (id_line, lines) = first.await.unwrap();
    let py_id = id_line.strip_prefix("ID ").expect("the script prints its id first").to_owned();

    // The stranger's first message waits behind a request; accepting it shows the message.
    let seen = bob
        .eventually(30, || async {
            bob.call(Request::ContactRequests).await.as_array().unwrap().iter().any(|r| r["id"] == py_id.as_str())
        })
        .await;
    assert!(seen, "the Python client's message never arrived as a request");
    bob.call(Request::ContactAccept { name: "pyagent".into(), new_name: None }).await;
    let got = bob.inbox(10).await;
    assert_eq!(got[0]["body"], "hello from python");
    assert_eq!(got[0]["from"], "pyagent");

    bob.call(Request::Send {
        contact: "pyagent".into(),
        text: "hello python, this is switchboard".into(),
        kind: None,
        reply_to: None,
        from_agent: None,
        to_agent: None,
    })
    .await;
    let rest = tokio::task::spawn_blocking(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let status = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    let rest = rest.await.unwrap();
    assert!(status.status.success(), "python failed: {}", String::from_utf8_lossy(&status.stderr));
    assert!(rest.iter().any(|l| l == "REPLY hello python, this is switchboard"), "{rest:?}");
}
