//! System notifications (notify-rust): which messages notify, one live notification per
//! conversation, and a click that opens the conversation.
//!
//! - [`decide`] is the whole policy, as a pure function: only incoming messages, only with
//!   notifications on, do-not-disturb off, the conversation not muted and the window not focused.
//! - Grouping: the first notification of a conversation gets an id from the notification server;
//!   later ones are sent with that id as `replaces_id`, so the server updates the one notification
//!   instead of stacking another (the body says how many arrived).
//! - Clicks: each notification carries the `default` action. On Linux the app keeps one
//!   session-bus connection: it sends every notification (the freedesktop `Notify` call) and one
//!   listener thread hears `ActionInvoked` on it for every id, mapped back to its conversation.
//!   That replaces notify-rust's one connection and one blocked `wait_for_action` thread per
//!   notification: servers such as dunst send the action only to the sending connection, and a
//!   replaced notification never reports closing, so those threads would pile up. The click shows
//!   and focuses the window and emits [`OPEN_CONVERSATION`] to the UI. Elsewhere notify-rust
//!   shows the notification and clicks are not heard.
//! - Without a notification server nothing is shown; that is not an error for the app.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde_json::Value;
use tauri::{AppHandle, Emitter, Runtime};

use crate::settings::Settings;

/// The UI event a clicked notification sends: the conversation key (`c:NAME` for a contact,
/// `g:GROUP` for a letmeknow group).
pub const OPEN_CONVERSATION: &str = "open-conversation";

/// The key of a message's conversation: `c:` and the contact's name.
pub fn conversation_key(m: &Value) -> Option<String> {
    let from = m.get("from").and_then(Value::as_str)?;
    Some(format!("c:{from}"))
}

/// What to do with a stored message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Show (or update) the conversation's notification.
    Show(Pending),
    /// Stay quiet, and why.
    Skip(&'static str),
}

/// A notification to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The conversation key.
    pub conversation: String,
    /// Title: who wrote.
    pub summary: String,
    /// The text (first 200 characters).
    pub body: String,
}

/// The checks every notification passes, in order; `Some(reason)` to stay quiet.
fn quiet(settings: &Settings, conversation: &str, focused: bool) -> Option<&'static str> {
    if !settings.notifications {
        Some("notifications off")
    } else if settings.do_not_disturb {
        Some("do not disturb")
    } else if settings.muted.contains(conversation) {
        Some("muted")
    } else if focused {
        Some("window focused")
    } else {
        None
    }
}

/// The policy for a group message from `from` (empty: an alert from the runtime); `unread` is
/// the group's unread count now; `g:GROUP` is its conversation.
pub fn decide_group(settings: &Settings, group: &str, unread: i64, from: &str, focused: bool) -> Decision {
    let conversation = format!("g:{group}");
    if let Some(why) = quiet(settings, &conversation, focused) {
        return Decision::Skip(why);
    }
    let short: String = group.chars().take(12).collect();
    // A peer chose the name: one line, no control characters, cut short.
    let from: String = from.chars().filter(|c| !c.is_control()).take(64).collect();
    let count = if unread == 1 { "1 unread message".to_owned() } else { format!("{unread} unread messages") };
    let body =
        if from.trim().is_empty() { format!("{count} (an alert)") } else { format!("{count}, the latest from {from}") };
    Decision::Show(Pending { conversation, summary: format!("Group {short}"), body })
}

/// The policy: whether message `m` (the runtime's message DTO) notifies.
pub fn decide(settings: &Settings, m: &Value, focused: bool) -> Decision {
    if m.get("direction").and_then(Value::as_str) != Some("in") {
        return Decision::Skip("own message");
    }
    let Some(conversation) = conversation_key(m) else { return Decision::Skip("no conversation") };
    if let Some(why) = quiet(settings, &conversation, focused) {
        return Decision::Skip(why);
    }
    let summary = m.get("from").and_then(Value::as_str).unwrap_or("someone").to_owned();
    let body: String = match m.get("body") {
        Some(Value::String(s)) => s.chars().take(200).collect(),
        Some(other) => other.to_string().chars().take(200).collect(),
        None => String::new(),
    };
    // A contact's move to another relay is a line, not words of theirs (the body is the URL).
    let body = if m.get("kind").and_then(Value::as_str) == Some("moved") {
        format!("moved to the relay at {body}")
    } else {
        body
    };
    Decision::Show(Pending { conversation, summary, body })
}

/// Group messages already counted: a peer message reaches every local session in its group,
/// each storing it and raising its own event; the badge and the notification count it once.
#[derive(Debug, Default)]
pub struct SeenGroupMessages {
    recent: Mutex<std::collections::VecDeque<(String, String)>>,
}

impl SeenGroupMessages {
    /// How many (group, id) pairs are remembered; sessions store a message within moments of
    /// each other, so a short memory is enough.
    const KEEP: usize = 256;

    /// Whether message `id` of `group` comes for the first time (and remembers it).
    pub fn first(&self, group: &str, id: &str) -> bool {
        let Ok(mut recent) = self.recent.lock() else { return true };
        if recent.iter().any(|(g, i)| g == group && i == id) {
            return false;
        }
        if recent.len() >= Self::KEEP {
            recent.pop_front();
        }
        recent.push_back((group.to_owned(), id.to_owned()));
        true
    }
}

/// The live notifications: conversation to server id and back, and how many messages each
/// stands for. Entries are never dropped (a closed notification's id is reused by the next one,
/// which the server then shows afresh), so the maps hold one entry per notified conversation.
#[derive(Debug, Default)]
pub struct Live {
    inner: Mutex<LiveInner>,
    /// The one session-bus connection notifications are sent and clicks heard on.
    #[cfg(all(unix, not(target_os = "macos")))]
    bus: Mutex<Option<zbus::Connection>>,
}

#[derive(Debug, Default)]
struct LiveInner {
    by_conversation: BTreeMap<String, (u32, u32)>,
    by_id: BTreeMap<u32, String>,
}

impl Live {
    /// The id to replace for `conversation` (0: a new notification) and the message count so
    /// far, counting this one.
    fn next(&self, conversation: &str) -> (u32, u32) {
        let Ok(mut g) = self.inner.lock() else { return (0, 1) };
        let entry = g.by_conversation.entry(conversation.to_owned()).or_insert((0, 0));
        entry.1 = entry.1.saturating_add(1);
        *entry
    }

    /// Records the id the server gave `conversation`'s notification.
    fn shown(&self, conversation: &str, id: u32) {
        let Ok(mut g) = self.inner.lock() else { return };
        if let Some(old) = g.by_conversation.get(conversation).map(|e| e.0)
            && old != id
        {
            g.by_id.remove(&old);
        }
        let count = g.by_conversation.get(conversation).map_or(1, |e| e.1);
        g.by_conversation.insert(conversation.to_owned(), (id, count));
        g.by_id.insert(id, conversation.to_owned());
    }

    /// The conversation a notification id belongs to.
    pub fn conversation_of(&self, id: u32) -> Option<String> {
        self.inner.lock().ok()?.by_id.get(&id).cloned()
    }

    /// The window was seen: every conversation's next notification counts from one again.
    pub fn seen_all(&self) {
        if let Ok(mut g) = self.inner.lock() {
            for e in g.by_conversation.values_mut() {
                e.1 = 0;
            }
        }
    }

    /// The live notification id of `conversation`, if one was shown.
    pub fn id_of(&self, conversation: &str) -> Option<u32> {
        self.inner.lock().ok()?.by_conversation.get(conversation).map(|e| e.0).filter(|id| *id != 0)
    }

    /// Every notification id shown so far.
    fn ids(&self) -> Vec<u32> {
        self.inner.lock().map(|g| g.by_id.keys().copied().collect()).unwrap_or_default()
    }
}

/// Withdraws the notifications of `conversation` (all of them when `None`) on a blocking thread:
/// the window was seen, or the conversation muted.
pub fn withdraw<R: Runtime>(app: &AppHandle<R>, conversation: Option<&str>) {
    use tauri::Manager as _;
    let live = &app.state::<crate::host::AppState>().notifications;
    let ids = match conversation {
        Some(c) => live.id_of(c).into_iter().collect(),
        None => live.ids(),
    };
    if ids.is_empty() {
        return;
    }
    let app = app.clone();
    tauri::async_runtime::spawn_blocking(move || {
        let state = app.state::<crate::host::AppState>();
        for id in ids {
            if let Err(e) = close_now(&state.notifications, id) {
                tracing::debug!("notification {id} not withdrawn: {e}");
            }
        }
    });
}

/// The freedesktop `CloseNotification` call, on the connection that showed it.
#[cfg(all(unix, not(target_os = "macos")))]
fn close_now(live: &Live, id: u32) -> Result<(), NotifyError> {
    let Some(conn) = live.bus.lock().ok().and_then(|b| b.clone()) else { return Ok(()) };
    zbus::block_on(conn.call_method(
        Some("org.freedesktop.Notifications"),
        "/org/freedesktop/Notifications",
        Some("org.freedesktop.Notifications"),
        "CloseNotification",
        &(id,),
    ))?;
    Ok(())
}

#[cfg(not(all(unix, not(target_os = "macos"))))]
fn close_now(_live: &Live, _id: u32) -> Result<(), NotifyError> {
    Ok(())
}

/// Why a notification was not shown (no notification server, no session bus: not an error for
/// the app, which logs it and goes on).
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// The session bus or the notification server refused.
    #[cfg(all(unix, not(target_os = "macos")))]
    #[error("notification server: {0}")]
    Bus(#[from] zbus::Error),
    /// notify-rust failed.
    #[cfg(not(all(unix, not(target_os = "macos"))))]
    #[error("notification: {0}")]
    Notify(#[from] notify_rust::error::Error),
}

/// Shows or updates `p`'s conversation notification on a blocking thread.
pub fn show<R: Runtime>(app: &AppHandle<R>, p: Pending) {
    let app = app.clone();
    tauri::async_runtime::spawn_blocking(move || {
        if let Err(e) = show_now(&app, &p) {
            tracing::debug!("notification not shown: {e}");
        }
    });
}

/// Sends `p`'s notification now (blocking), replacing the conversation's live one; returns its
/// server id.
pub fn show_now<R: Runtime>(app: &AppHandle<R>, p: &Pending) -> Result<u32, NotifyError> {
    use tauri::Manager as _;
    let live = &app.state::<crate::host::AppState>().notifications;
    let (replaces, count) = live.next(&p.conversation);
    let body = if count > 1 { format!("{} ({count} new messages)", p.body) } else { p.body.clone() };
    let id = send(app, live, replaces, &p.summary, &body)?;
    live.shown(&p.conversation, id);
    Ok(id)
}

/// The freedesktop notification call on the app's one session-bus connection. Servers such as
/// dunst send `ActionInvoked` only to the connection that sent the notification, so sending and
/// listening share it (notify-rust opens a new connection per notification).
#[cfg(all(unix, not(target_os = "macos")))]
fn send<R: Runtime>(
    app: &AppHandle<R>,
    live: &Live,
    replaces: u32,
    summary: &str,
    body: &str,
) -> Result<u32, NotifyError> {
    let conn = live.connection(app)?;
    let mut hints = std::collections::HashMap::<&str, zbus::Variant<'_>>::new();
    hints.insert("category", zbus::Variant::from("im.received"));
    hints.insert("desktop-entry", zbus::Variant::from("switchboard"));
    let actions = ["default", "Open"];
    let sent = zbus::block_on(async {
        let reply = conn
            .call_method(
                Some("org.freedesktop.Notifications"),
                "/org/freedesktop/Notifications",
                Some("org.freedesktop.Notifications"),
                "Notify",
                &("Switchboard", replaces, "", summary, body, &actions[..], hints, -1i32),
            )
            .await?;
        reply.body().deserialize::<u32>()
    });
    if sent.is_err() {
        // A broken connection is made again (with its listener) on the next notification.
        live.forget_connection();
    }
    Ok(sent?)
}

/// Elsewhere notify-rust shows it (clicks are not heard there).
#[cfg(not(all(unix, not(target_os = "macos"))))]
fn send<R: Runtime>(
    _app: &AppHandle<R>,
    _live: &Live,
    replaces: u32,
    summary: &str,
    body: &str,
) -> Result<u32, NotifyError> {
    let mut n = notify_rust::Notification::new();
    n.appname("Switchboard").summary(summary).body(body);
    if replaces != 0 {
        n.id(replaces);
    }
    Ok(n.show().map(|h| h.id())?)
}

#[cfg(all(unix, not(target_os = "macos")))]
impl Live {
    /// The session-bus connection, made on first use together with the thread that hears clicks
    /// on it (subscribed before the first notification is sent).
    fn connection<R: Runtime>(&self, app: &AppHandle<R>) -> zbus::Result<zbus::Connection> {
        let mut bus = self.bus.lock().map_err(|_| zbus::Error::Failure("notification lock".into()))?;
        if let Some(c) = &*bus {
            return Ok(c.clone());
        }
        let (conn, stream) = zbus::block_on(async {
            let conn = zbus::Connection::session().await?;
            let rule = zbus::MatchRule::builder()
                .msg_type(zbus::message::Type::Signal)
                .interface("org.freedesktop.Notifications")
                .member("ActionInvoked")
                .build()?;
            let stream = zbus::MessageStream::for_match_rule(rule, &conn, None).await?;
            Ok::<_, zbus::Error>((conn, stream))
        })?;
        let app = app.clone();
        std::thread::Builder::new()
            .name("notification-clicks".into())
            .spawn(move || {
                zbus::block_on(click_loop(stream, |id| {
                    use tauri::Manager as _;
                    if let Some(c) = app.state::<crate::host::AppState>().notifications.conversation_of(id) {
                        open(&app, &c);
                    }
                }));
            })
            .map_err(|e| zbus::Error::Failure(format!("no click listener: {e}")))?;
        *bus = Some(conn.clone());
        Ok(conn)
    }

    fn forget_connection(&self) {
        if let Ok(mut bus) = self.bus.lock() {
            *bus = None;
        }
    }
}

/// A click on a notification: show and focus the window, tell the UI which conversation.
pub fn open<R: Runtime>(app: &AppHandle<R>, conversation: &str) {
    crate::tray::show(app);
    let _ = app.emit(OPEN_CONVERSATION, conversation);
}

/// Calls `on_default(id)` for every `ActionInvoked(id, "default")` the stream carries, until the
/// connection closes.
#[cfg(all(unix, not(target_os = "macos")))]
async fn click_loop(mut stream: zbus::MessageStream, mut on_default: impl FnMut(u32)) {
    use futures_util::StreamExt as _;
    while let Some(msg) = stream.next().await {
        let Ok(msg) = msg else { continue };
        if let Ok((id, action)) = msg.body().deserialize::<(u32, String)>()
            && action == "default"
        {
            on_default(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn incoming(from: &str, body: &str) -> Value {
        json!({"direction": "in", "from": from, "to": "me", "body": body, "kind": "send"})
    }

    #[test]
    fn a_contacts_move_notifies_as_a_line_not_as_their_words() {
        let mut m = incoming("bob", "https://relay-b.example");
        m["kind"] = "moved".into();
        match decide(&Settings::default(), &m, false) {
            Decision::Show(p) => assert_eq!(p.body, "moved to the relay at https://relay-b.example"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_incoming_message_notifies_under_its_conversation() {
        let d = decide(&Settings::default(), &incoming("bob", "hello"), false);
        assert_eq!(
            d,
            Decision::Show(Pending { conversation: "c:bob".into(), summary: "bob".into(), body: "hello".into() })
        );
    }

    #[test]
    fn own_messages_muted_conversations_dnd_and_a_focused_window_stay_quiet() {
        let s = Settings::default();
        let mine = json!({"direction": "out", "from": "me", "to": "bob", "body": "hi"});
        assert_eq!(decide(&s, &mine, false), Decision::Skip("own message"));
        let muted = Settings { muted: ["c:bob".to_owned()].into(), ..Settings::default() };
        assert_eq!(decide(&muted, &incoming("bob", "x"), false), Decision::Skip("muted"));
        assert!(matches!(decide(&muted, &incoming("carol", "x"), false), Decision::Show(_)));
        let dnd = Settings { do_not_disturb: true, ..Settings::default() };
        assert_eq!(decide(&dnd, &incoming("bob", "x"), false), Decision::Skip("do not disturb"));
        let off = Settings { notifications: false, ..Settings::default() };
        assert_eq!(decide(&off, &incoming("bob", "x"), false), Decision::Skip("notifications off"));
        assert_eq!(decide(&s, &incoming("bob", "x"), true), Decision::Skip("window focused"));
    }

    #[test]
    fn a_group_message_stored_by_two_local_sessions_counts_once() {
        let seen = SeenGroupMessages::default();
        assert!(seen.first("g1", "m1"));
        assert!(!seen.first("g1", "m1"), "the second session's copy");
        assert!(seen.first("g2", "m1"), "another group's message with the same id");
        for i in 0..SeenGroupMessages::KEEP {
            assert!(seen.first("g3", &i.to_string()));
        }
        assert!(seen.first("g1", "m1"), "forgotten after KEEP newer ones");
    }

    #[test]
    fn a_group_message_notifies_with_its_sender_unless_muted() {
        let s = Settings::default();
        let Decision::Show(p) = decide_group(&s, "g1", 3, "Bob's\nagent\u{7}", false) else { panic!() };
        assert_eq!(p.conversation, "g:g1");
        assert_eq!(p.body, "3 unread messages, the latest from Bob'sagent");
        let Decision::Show(p) = decide_group(&s, "g1", 1, "", false) else { panic!() };
        assert_eq!(p.body, "1 unread message (an alert)");
        let long = "x".repeat(500);
        let Decision::Show(p) = decide_group(&s, "g1", 1, &long, false) else { panic!() };
        assert_eq!(p.body.chars().count(), "1 unread message, the latest from ".len() + 64);
        let muted = Settings { muted: ["g:g1".to_owned()].into(), ..Settings::default() };
        assert_eq!(decide_group(&muted, "g1", 3, "bob", false), Decision::Skip("muted"));
        assert_eq!(decide_group(&s, "g1", 3, "bob", true), Decision::Skip("window focused"));
    }

    #[test]
    fn a_long_body_is_cut_to_200_characters() {
        let long = "é".repeat(500);
        let Decision::Show(p) = decide(&Settings::default(), &incoming("bob", &long), false) else { panic!() };
        assert_eq!(p.body.chars().count(), 200);
    }

    #[test]
    fn a_conversation_keeps_its_notification_id_and_counts_its_messages() {
        let live = Live::default();
        assert_eq!(live.next("c:bob"), (0, 1));
        live.shown("c:bob", 7);
        assert_eq!(live.next("c:bob"), (7, 2));
        live.shown("c:bob", 7);
        assert_eq!(live.conversation_of(7).as_deref(), Some("c:bob"));
        // A server that gives the replacement another id: the old id no longer maps.
        live.shown("c:bob", 9);
        assert_eq!(live.conversation_of(7), None);
        assert_eq!(live.conversation_of(9).as_deref(), Some("c:bob"));
        live.seen_all();
        assert_eq!(live.next("c:bob"), (9, 1));
        assert_eq!(live.id_of("c:carol"), None);
    }
}
