//! relay-lite's ASNET SMTP server on arbitrary bytes: the command parser never panics, and the
//! transaction state machine and the DATA reader, fed the bytes as lines, keep their bounds (one
//! recipient, and only the service mailbox; a message never over the raw limit).
#![no_main]

use libfuzzer_sys::fuzz_target;
use relay_lite::asnet::smtp::{DataBody, DataLine, Session, Step, parse_command};
use switchboard_core::protocol::asnet::Mailbox;
use switchboard_core::protocol::asnet::mime::MAX_RAW_BYTES;

fuzz_target!(|data: &[u8]| {
    let Ok(service) = Mailbox::parse("network@example.test") else { return };
    let mut session = Session::new(service.clone(), "asnet.test");
    let mut body: Option<DataBody> = None;
    for line in data.split_inclusive(|b| *b == b'\n') {
        if let Some(b) = body.as_mut() {
            if b.push_line(line) == DataLine::End {
                let done = body.take().map(DataBody::finish);
                if let Some(Ok(raw)) = done {
                    assert!(raw.len() <= MAX_RAW_BYTES);
                }
                let (_, to) = session.finish_data().expect("DATA only starts after a recipient");
                assert_eq!(Mailbox::parse(&to).ok(), Some(service.clone()));
            }
            continue;
        }
        let text = line.strip_suffix(b"\n").unwrap_or(line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        match session.command(parse_command(text)) {
            Step::Reply(r) => assert!((200..600).contains(&r.code)),
            Step::StartData(_) => body = Some(DataBody::new(MAX_RAW_BYTES)),
            Step::Close(_) => return,
        }
    }
});
