//! ASNET/1 commands processed per second by the sans-io service core (in-memory store), against
//! the strict JSON parse of the same body measured in the same run; and the MIME adapter per
//! mail. Each iteration is one inbound mail with a fresh delivery id and a clock one second on.
//! Budgets are raised so every mail is admitted. Compare medians as ratios, not absolute times.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use switchboard_core::protocol::agent_identity::json;
use switchboard_core::protocol::asnet::command::Action;
use switchboard_core::protocol::asnet::mime::{Policy, SmtpEnvelope, adapt};
use switchboard_core::protocol::asnet::store::Store;
use switchboard_core::protocol::asnet::{
    Command, Config, EnvelopeIn, Limits, Mailbox, MemoryStore, ReplyBody, Scope, Scopes, receive,
};
use switchboard_core::util::SeededRng;

const T0: i64 = 1_790_726_400_000;
const SERVICE: &str = "network@example.test";

struct Bench {
    config: Config,
    store: MemoryStore,
    rng: SeededRng,
    now: i64,
    n: u64,
}

impl Bench {
    fn new() -> Self {
        let config = Config {
            service: Mailbox::parse(SERVICE).unwrap(),
            limits: Limits { per_sender: u32::MAX, global: u32::MAX },
        };
        Self { config, store: MemoryStore::new(), rng: SeededRng::new([1; 32]), now: T0, n: 0 }
    }

    fn send(&mut self, from: &str, body: String) -> switchboard_core::protocol::asnet::Outcome {
        self.n += 1;
        self.now += 1000;
        if self.n.is_multiple_of(50_000) {
            self.store.sweep(self.now).unwrap();
        }
        let env = EnvelopeIn {
            sender: from.into(),
            recipient: SERVICE.into(),
            delivery_id: format!("q{}", self.n),
            auto_submitted: None,
            body,
        };
        receive(&self.config, &mut self.store, &env, self.now, &mut self.rng).unwrap()
    }

    fn run(&mut self, from: &str, body: String) -> switchboard_core::protocol::asnet::Outcome {
        let out = self.send(from, body);
        let ReplyBody::Challenge { challenge_id, code, .. } = &out.outbox[0].body else { panic!("no challenge") };
        self.send(from, Command::Verify { challenge_id: *challenge_id, code: code.clone() }.to_body())
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("asnet");
    g.throughput(Throughput::Elements(1));

    let mut s = Bench::new();
    // A graph: member 0 connected to 20 others.
    let mut ids = Vec::new();
    for i in 0..21 {
        let out = s.run(
            &format!("m{i}@example.test"),
            Command::Protected(Action::Register { discovery: Some(true) }).to_body(),
        );
        let ReplyBody::Registered { member_id, .. } = out.outbox[0].body else { panic!() };
        ids.push(member_id);
    }
    let scopes = Scopes::new(vec![Scope::ContactEmail]).unwrap();
    for (i, id) in ids.iter().enumerate().skip(1) {
        let out = s.run(
            "m0@example.test",
            Command::Protected(Action::Connect { member_id: *id, scopes: scopes.clone() }).to_body(),
        );
        let ReplyBody::Invitation { request_id, .. } = out.outbox[1].body else { panic!() };
        s.run(
            &format!("m{i}@example.test"),
            Command::Protected(Action::Accept { request_id, scopes: scopes.clone() }).to_body(),
        );
    }

    let lookup = Command::Lookup { member_id: ids[3] }.to_body();
    g.bench_function("baseline_strict_json_parse_of_lookup", |b| {
        b.iter(|| json::parse(black_box(lookup.as_bytes())).unwrap())
    });
    g.bench_function("lookup", |b| b.iter(|| black_box(s.send("reader@example.test", lookup.clone()))));
    let register = Command::Protected(Action::Register { discovery: None }).to_body();
    g.bench_function("protected_command_to_challenge", |b| {
        b.iter(|| black_box(s.send("m5@example.test", register.clone())))
    });
    g.bench_function("register_request_and_verify_2_mails", |b| {
        b.iter(|| black_box(s.run("m7@example.test", register.clone())))
    });
    let list = Command::Protected(Action::ListConnections).to_body();
    g.bench_function("list_20_connections_request_and_verify_2_mails", |b| {
        b.iter(|| black_box(s.run("m0@example.test", list.clone())))
    });
    g.bench_function("malformed_body_rejected", |b| b.iter(|| black_box(s.send("m9@example.test", "{nope".into()))));

    let raw = format!(
        "Received: from mail.example.test (mail.example.test [198.18.0.2])\r\n\tby mx.example.test (Postfix) with ESMTPS id 4Q7xYz1AbCdEf\r\n\tfor <network@example.test>; Thu, 01 Oct 2026 00:00:00 +0000 (UTC)\r\nAuthentication-Results: mx.example.test; spf=pass smtp.mailfrom=alice@example.test;\r\n dkim=pass header.d=example.test header.b=Ab/c+D=; dmarc=pass header.from=example.test\r\nFrom: \"Alice\" <alice@example.test>\r\nTo: network@example.test\r\nSubject: asnet\r\nDate: Thu, 01 Oct 2026 00:00:00 +0000\r\nMessage-ID: <1@example.test>\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{lookup}\r\n"
    );
    let policy = Policy { service: Mailbox::parse(SERVICE).unwrap(), authserv_id: "mx.example.test".into() };
    let rcpt = vec![SERVICE.to_owned()];
    g.bench_function("mime_adapt", |b| {
        b.iter(|| {
            adapt(black_box(raw.as_bytes()), SmtpEnvelope { mail_from: "alice@example.test", rcpt_to: &rcpt }, &policy)
                .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
