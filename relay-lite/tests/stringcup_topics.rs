//! Stringcup v2 topics over real HTTP: relay-assigned ids, rosters with keys, the owner's
//! rules, the member limit, and `404` (never `403`) for everyone outside a topic, whichever
//! form of its name they use.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod sc_common;

use sc_common::{Agent, Relay, relay, relay_with};
use serde_json::{Value, json};

fn is_tp_id(id: &str) -> bool {
    id.strip_prefix("tp-").is_some_and(|rest| {
        rest.len() == 24 && rest.bytes().all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
    })
}

/// Creates a topic owned by `owner` with `members` added; returns its id.
async fn topic(relay: &Relay, owner: &Agent, members: &[&Agent]) -> String {
    let reply = relay.post(owner, "/topics", &json!({})).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    let id = reply.body["id"].as_str().unwrap().to_owned();
    if !members.is_empty() {
        let ids: Vec<&str> = members.iter().map(|m| m.id.as_str()).collect();
        let reply = relay.post(owner, &format!("/topics/{id}/members"), &json!({ "members": ids })).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
    }
    id
}

fn member_ids(roster: &Value) -> Vec<String> {
    roster["members"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn creating_a_topic_assigns_a_tp_id_and_makes_the_caller_owner_and_first_member() {
    let relay = relay().await;
    let alice = relay.register("alice").await;
    let reply = relay.post(&alice, "/topics", &json!({})).await;
    assert_eq!(reply.status, 201);
    assert!(is_tp_id(reply.body["id"].as_str().unwrap()), "{}", reply.body["id"]);
    assert_eq!(reply.body["owner_id"], alice.id);
    assert_eq!(reply.body["role"], "owner");
    assert_eq!(reply.body["is_owner"], true);
    assert_eq!(reply.body["member_count"], 1);
    assert_eq!((&reply.body["added"], &reply.body["unknown"]), (&json!([]), &json!([])));
    // An empty body works too, and two topics never share an id.
    let second = relay.call(relay.req(&alice, reqwest::Method::POST, "/topics")).await;
    assert_eq!(second.status, 201);
    assert_ne!(second.body["id"], reply.body["id"]);
}

#[tokio::test]
async fn a_topic_may_be_created_with_its_members_in_one_call() {
    let relay = relay().await;
    let (alice, bob, carol) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("carol").await);
    let unknown = format!("sc-{}", "u".repeat(24));
    // What the reference client sends: `members`, with repeats, unknowns and the owner tolerated.
    let reply =
        relay.post(&alice, "/topics", &json!({"members": [bob.id, carol.id, bob.id, unknown, "bob", alice.id]})).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    let id = reply.body["id"].as_str().unwrap().to_owned();
    assert_eq!(reply.body["member_count"], 3);
    assert_eq!(reply.body["added"], json!([bob.id, carol.id]));
    assert_eq!(reply.body["already_member"], json!([alice.id]));
    assert_eq!(reply.body["unknown"], json!([unknown, "bob"]));
    let roster = relay.get(&carol, &format!("/topics/{id}")).await;
    assert_eq!(member_ids(&roster.body), vec![alice.id.clone(), bob.id.clone(), carol.id.clone()]);
    // `ids` is accepted as for additions.
    let reply = relay.post(&bob, "/topics", &json!({"ids": [carol.id]})).await;
    assert_eq!(reply.body["member_count"], 2);
    // A member's list says it does not own the topic.
    let listed = relay.get(&carol, "/topics").await.body;
    let owned: Vec<bool> =
        listed["topics"].as_array().unwrap().iter().map(|t| t["is_owner"].as_bool().unwrap()).collect();
    assert_eq!(owned, vec![false, false]);
    assert_eq!(relay.get(&alice, "/topics").await.body["topics"][0]["is_owner"], true);
    // Malformed lists are refused; nothing is created.
    for body in [json!({"members": "bob"}), json!({"members": [1]})] {
        assert_eq!(relay.post(&carol, "/topics", &body).await.status, 400, "{body}");
    }
    assert_eq!(relay.get(&carol, "/topics").await.body["count"], 2);
}

#[tokio::test]
async fn creating_a_topic_with_too_many_members_creates_nothing() {
    let relay = relay_with(|l| {
        l.topic_max_members = 3;
        l.topic_max_add = 3;
    })
    .await;
    let alice = relay.register("alice").await;
    let mut others = Vec::new();
    for name in ["b", "c", "d", "e"] {
        others.push(relay.register(name).await.id);
    }
    let over = relay.post(&alice, "/topics", &json!({ "members": &others[..3] })).await;
    assert_eq!((over.status, over.code()), (409, "topic_full"));
    let past_batch = relay.post(&alice, "/topics", &json!({ "members": others })).await;
    assert_eq!(past_batch.status, 400);
    assert_eq!(relay.get(&alice, "/topics").await.body["count"], 0, "nothing was created");
    let fits = relay.post(&alice, "/topics", &json!({ "members": &others[..2] })).await;
    assert_eq!((fits.status, fits.body["member_count"].as_u64()), (201, Some(3)));
}

#[tokio::test]
async fn a_topic_name_is_refused_with_400() {
    let relay = relay().await;
    let alice = relay.register("alice").await;
    let reply = relay.post(&alice, "/topics", &json!({"name": "merger-talks"})).await;
    assert_eq!(reply.status, 400);
    assert!(reply.message().contains("name"));
    assert_eq!(relay.get(&alice, "/topics").await.body["count"], 0, "nothing was created");
}

#[tokio::test]
async fn the_roster_carries_every_members_key_and_fingerprint() {
    let relay = relay().await;
    let (alice, bob, carol) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("carol").await);
    let id = topic(&relay, &alice, &[&bob, &carol]).await;
    let reply = relay.get(&bob, &format!("/topics/{id}")).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.body["id"], id);
    assert_eq!(reply.body["owner_id"], alice.id);
    assert_eq!(reply.body["count"], 3);
    assert_eq!(member_ids(&reply.body), vec![alice.id.clone(), bob.id.clone(), carol.id.clone()]);
    let lookup = relay.call(relay.anon(reqwest::Method::GET, &format!("/identities/{}", carol.id))).await.body;
    let carol_entry = &reply.body["members"][2];
    for field in ["identity_public_key", "fingerprint", "fingerprint_short", "key_updated_at"] {
        assert_eq!(carol_entry[field], lookup[field], "{field}");
    }
    assert_eq!(reply.body["members"][0]["role"], "owner");
    assert_eq!(carol_entry["role"], "member");
}

#[tokio::test]
async fn a_caller_lists_the_topics_it_belongs_to() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let mine = topic(&relay, &alice, &[]).await;
    let shared = topic(&relay, &bob, &[&alice]).await;
    topic(&relay, &bob, &[]).await;
    let list = relay.get(&alice, "/topics").await.body;
    assert_eq!(list["count"], 2);
    let roles: Vec<(String, String)> = list["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_str().unwrap().to_owned(), t["role"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(roles, vec![(mine, "owner".to_owned()), (shared, "member".to_owned())]);
}

#[tokio::test]
async fn outsiders_get_the_same_404_as_for_a_topic_that_does_not_exist() {
    let relay = relay().await;
    let (alice, bob, mallory) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("mallory").await);
    let id = topic(&relay, &alice, &[&bob]).await;
    let missing = format!("tp-{}", "a".repeat(24));
    for target in [&id, &missing] {
        let answers = [
            relay.get(&mallory, &format!("/topics/{target}")).await,
            relay.post(&mallory, &format!("/topics/{target}/members"), &json!({"members": [mallory.id]})).await,
            relay.delete(&mallory, &format!("/topics/{target}/members/{}", bob.id)).await,
            relay.delete(&mallory, &format!("/topics/{target}/members/{}", mallory.id)).await,
            relay.delete(&mallory, &format!("/topics/{target}")).await,
        ];
        for reply in answers {
            assert_eq!(reply.status, 404, "{target}: {:?}", reply.body);
            assert_eq!(reply.body, json!({"error": "not_found", "message": "no such topic"}));
        }
    }
    assert_eq!(member_ids(&relay.get(&alice, &format!("/topics/{id}")).await.body), vec![alice.id, bob.id]);
}

#[tokio::test]
async fn only_the_owner_adds_members_and_repeats_and_unknown_ids_are_harmless() {
    let relay = relay().await;
    let (alice, bob, carol) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("carol").await);
    let id = topic(&relay, &alice, &[&bob]).await;
    let by_member = relay.post(&bob, &format!("/topics/{id}/members"), &json!({"members": [carol.id]})).await;
    assert_eq!(by_member.status, 403, "a member knows the topic exists; only the owner may add");
    let unknown = format!("sc-{}", "u".repeat(24));
    let reply = relay
        .post(
            &alice,
            &format!("/topics/{id}/members"),
            &json!({"members": [carol.id, bob.id, carol.id, unknown, "bob"]}),
        )
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.body,
        json!({"topic_id": id, "added": [carol.id], "already_member": [bob.id], "unknown": [unknown, "bob"], "member_count": 3})
    );
    let repeat = relay.post(&alice, &format!("/topics/{id}/members"), &json!({"ids": [carol.id]})).await;
    assert_eq!(repeat.body["already_member"], json!([carol.id]));
    assert_eq!(repeat.body["member_count"], 3);
}

#[tokio::test]
async fn the_owner_stays_members_may_leave_and_only_the_owner_removes_others() {
    let relay = relay().await;
    let (alice, bob, carol) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("carol").await);
    let id = topic(&relay, &alice, &[&bob, &carol]).await;
    let owner_leaves = relay.delete(&alice, &format!("/topics/{id}/members/{}", alice.id)).await;
    assert_eq!((owner_leaves.status, owner_leaves.code()), (409, "owner_cannot_leave"));
    assert_eq!(relay.delete(&bob, &format!("/topics/{id}/members/{}", alice.id)).await.status, 403);
    assert_eq!(relay.delete(&bob, &format!("/topics/{id}/members/{}", carol.id)).await.status, 403);
    let left = relay.delete(&bob, &format!("/topics/{id}/members/{}", bob.id)).await;
    assert_eq!(left.status, 200);
    assert_eq!(left.body, json!({"status": "removed", "topic_id": id, "member_id": bob.id}));
    assert_eq!(relay.get(&bob, &format!("/topics/{id}")).await.status, 404, "a former member is an outsider");
    assert_eq!(relay.delete(&alice, &format!("/topics/{id}/members/{}", carol.id)).await.status, 200);
    assert_eq!(relay.delete(&alice, &format!("/topics/{id}/members/{}", carol.id)).await.status, 404);
    assert_eq!(member_ids(&relay.get(&alice, &format!("/topics/{id}")).await.body), vec![alice.id]);
}

#[tokio::test]
async fn only_the_owner_deletes_a_topic_and_messages_already_sent_survive() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let id = topic(&relay, &alice, &[&bob]).await;
    relay.send(&alice, &bob, "sent to bob, not to the topic").await;
    assert_eq!(relay.delete(&bob, &format!("/topics/{id}")).await.status, 403);
    let deleted = relay.delete(&alice, &format!("/topics/{id}")).await;
    assert_eq!(deleted.status, 200);
    assert_eq!(deleted.body, json!({"status": "deleted", "topic_id": id}));
    assert_eq!(relay.get(&alice, &format!("/topics/{id}")).await.status, 404);
    assert_eq!(relay.get(&bob, "/topics").await.body["count"], 0);
    assert_eq!(relay.inbox_ids(&bob).await, vec![1]);
}

#[tokio::test]
async fn a_topic_holds_at_most_its_member_limit_and_a_call_adds_at_most_its_batch() {
    let relay = relay_with(|l| {
        l.topic_max_members = 3;
        l.topic_max_add = 2;
    })
    .await;
    let alice = relay.register("alice").await;
    let mut others = Vec::new();
    for name in ["b", "c", "d"] {
        others.push(relay.register(name).await);
    }
    let id = topic(&relay, &alice, &[]).await;
    let three: Vec<&str> = others.iter().map(|o| o.id.as_str()).collect();
    let too_many = relay.post(&alice, &format!("/topics/{id}/members"), &json!({ "members": three })).await;
    assert_eq!(too_many.status, 400);
    let two = relay.post(&alice, &format!("/topics/{id}/members"), &json!({ "members": &three[..2] })).await;
    assert_eq!(two.body["member_count"], 3);
    let full = relay.post(&alice, &format!("/topics/{id}/members"), &json!({ "members": [three[2]] })).await;
    assert_eq!((full.status, full.code()), (409, "topic_full"));
    assert_eq!(relay.get(&alice, &format!("/topics/{id}")).await.body["count"], 3, "nothing was added");
}

#[tokio::test]
async fn a_legacy_name_reaches_the_same_topic_through_the_same_checks() {
    let relay = relay().await;
    let (alice, bob, mallory) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("mallory").await);
    let id = topic(&relay, &alice, &[&bob]).await;
    // A topic imported from before ids were assigned keeps its old name as a second handle.
    let db = relay.dir.path().join(relay_lite::store::DB_FILE);
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display())).await.unwrap();
    sqlx::query("UPDATE sc_topic SET legacy_name = 'design-review' WHERE id = ?")
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let by_name = relay.get(&bob, "/topics/design-review").await;
    assert_eq!(by_name.status, 200);
    assert_eq!(by_name.body["id"], id);
    for reply in [
        relay.get(&mallory, "/topics/design-review").await,
        relay.post(&mallory, "/topics/design-review/members", &json!({"members": [mallory.id]})).await,
        relay.delete(&mallory, "/topics/design-review").await,
    ] {
        assert_eq!((reply.status, reply.message()), (404, "no such topic"));
    }
    assert_eq!(relay.delete(&bob, "/topics/design-review").await.status, 403);
    assert_eq!(relay.get(&mallory, "/topics/no-such-name").await.status, 404);
}
