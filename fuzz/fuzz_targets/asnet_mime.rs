//! The ASNET/1 MIME adapter on arbitrary bytes and on byte edits of a valid mail: never panics;
//! whatever it accepts names the SMTP sender and the service mailbox, carries a bounded body and
//! a printable delivery id, and never says it was automatic.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use switchboard_core::protocol::asnet::mime::{MAX_RAW_BYTES, Policy, SmtpEnvelope, adapt};
use switchboard_core::protocol::asnet::{Config, Mailbox, MemoryStore, receive};
use switchboard_core::util::SeededRng;

static VALID: LazyLock<Vec<u8>> = LazyLock::new(|| {
    concat!(
        "Received: from mail.example.test (mail.example.test [198.18.0.2])\r\n",
        "\tby mx.example.test (Postfix) with ESMTPS id 4Q7xYz1AbCdEf\r\n",
        "\tfor <network@example.test>; Thu, 01 Oct 2026 00:00:00 +0000 (UTC)\r\n",
        "Authentication-Results: mx.example.test; spf=pass smtp.mailfrom=alice@example.test;\r\n",
        " dkim=pass header.d=example.test header.b=Ab/c+D=; dmarc=pass header.from=example.test\r\n",
        "From: \"Alice\" <alice@example.test>\r\n",
        "To: network@example.test\r\n",
        "Subject: asnet\r\n",
        "Content-Type: text/plain; charset=utf-8\r\n",
        "Content-Transfer-Encoding: quoted-printable\r\n",
        "\r\n",
        "{\"protocol\":\"ASNET/1\",\"command\":\"REGISTER\",\"discovery\"=3Atrue}\r\n",
    )
    .as_bytes()
    .to_vec()
});

fn check(raw: &[u8]) {
    let service = Mailbox::parse("network@example.test").expect("service");
    let policy = Policy { service: service.clone(), authserv_id: "mx.example.test".into() };
    let rcpt = vec!["network@example.test".to_owned()];
    let smtp = SmtpEnvelope { mail_from: "alice@example.test", rcpt_to: &rcpt };
    let Ok(env) = adapt(raw, smtp, &policy) else { return };
    assert_eq!(env.sender, "alice@example.test");
    assert_eq!(env.recipient, service.as_str());
    assert!(env.body.len() <= MAX_RAW_BYTES);
    assert!(!env.delivery_id.is_empty() && env.delivery_id.bytes().all(|b| b.is_ascii_graphic()));
    assert!(env.auto_submitted.as_deref().is_none_or(|v| v.eq_ignore_ascii_case("no")));
    let mut store = MemoryStore::new();
    let out = receive(&Config::new(service), &mut store, &env, 1_790_726_400_000, &mut SeededRng::new([1; 32]))
        .expect("memory store");
    assert!(out.outbox.iter().all(|r| r.to.as_str() == "alice@example.test"));
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // Edits of a valid mail: (position, xor) pairs.
    let mut edited = VALID.clone();
    for pair in data.chunks_exact(3).take(8) {
        let at = usize::from(u16::from_le_bytes([pair[0], pair[1]])) % edited.len();
        edited[at] ^= pair[2];
    }
    check(&edited);
});
