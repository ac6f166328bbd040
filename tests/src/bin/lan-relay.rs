//! relay-lite inside a network namespace, for `tests/tests/lan_daemons.rs`
//! (`ip netns exec NS lan-relay ADDR:PORT DATA_DIR`): serves a self-signed certificate and prints
//! one line, `https://ADDR:PORT CERT_SHA256_HEX`, once it accepts connections; runs until killed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let listen = args.next().expect("ADDR:PORT").parse().expect("ADDR:PORT");
    let dir = args.next().expect("DATA_DIR");
    let mut config = relay_lite::Config::new(listen, dir);
    config.tls = relay_lite::TlsMode::SelfSigned;
    let relay = relay_lite::spawn(config).await.unwrap();
    let cert = relay.cert_sha256.map(|c| switchboard_core::util::hex(&c)).unwrap_or_default();
    let mut out = std::io::stdout().lock();
    writeln!(out, "https://{} {cert}", relay.addr).unwrap();
    out.flush().unwrap();
    drop(out);
    std::future::pending::<()>().await;
}
