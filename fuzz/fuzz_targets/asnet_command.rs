//! The ASNET/1 command codec and service on arbitrary bodies: never panics; an accepted command
//! re-encodes to a body that parses to the same command; the service never mails on a rejection
//! and only mails the sender or a stored member mailbox.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchboard_core::protocol::asnet::store::Store;
use switchboard_core::protocol::asnet::{
    Command, Config, EnvelopeIn, Mailbox, MemberId, MemoryStore, Status, command::Action, receive,
};
use switchboard_core::util::SeededRng;

const NOW: i64 = 1_790_726_400_000;

fn envelope(sender: &str, id: &str, body: String) -> EnvelopeIn {
    EnvelopeIn {
        sender: sender.into(),
        recipient: "network@example.test".into(),
        delivery_id: id.into(),
        auto_submitted: None,
        body,
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(cmd) = Command::parse(data) {
        let again = Command::parse(cmd.to_body().as_bytes()).expect("an encoded command parses");
        assert_eq!(again, cmd);
        if let Command::Protected(action) = &cmd {
            assert_eq!(Action::from_stored(&action.to_stored()).as_ref(), Some(action));
        }
    }
    let Ok(body) = std::str::from_utf8(data) else { return };

    // A service with two members, Alice and Bob, and the fuzz body from Alice.
    let config = Config::new(Mailbox::parse("network@example.test").expect("service"));
    let mut store = MemoryStore::new();
    let mut rng = SeededRng::new([3; 32]);
    let mut ids = Vec::new();
    for (i, who) in ["alice@example.test", "bob@example.test"].iter().enumerate() {
        let reg = Command::Protected(Action::Register { discovery: Some(true) }).to_body();
        let out = receive(&config, &mut store, &envelope(who, &format!("r{i}"), reg), NOW, &mut rng).expect("store");
        let Some(reply) = out.outbox.first() else { panic!("no challenge") };
        let json = reply.to_json();
        let verify = format!(
            r#"{{"protocol":"ASNET/1","command":"VERIFY","challengeId":{},"code":{}}}"#,
            json["challengeId"], json["code"]
        );
        receive(&config, &mut store, &envelope(who, &format!("v{i}"), verify), NOW, &mut rng).expect("store");
        let member = store.member_by_mailbox(&Mailbox::parse(who).expect("mailbox")).expect("store").expect("member");
        ids.push(member.id);
    }
    // Let the body name Bob where it says BOB.
    let bob: MemberId = ids[1];
    let body = body.replace("BOB", &bob.to_string());
    for (i, sender) in ["alice@example.test", "carol@example.test"].iter().enumerate() {
        let out = receive(&config, &mut store, &envelope(sender, &format!("f{i}"), body.clone()), NOW + 1, &mut rng)
            .expect("store");
        if out.status != Status::Processed {
            assert!(out.outbox.is_empty(), "a refusal mailed something");
        }
        for reply in &out.outbox {
            let to = reply.to.as_str();
            assert!(to == *sender || to == "bob@example.test", "mail to {to}");
            assert!(reply.body_text().is_ascii());
        }
    }
});
