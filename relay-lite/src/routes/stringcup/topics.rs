//! Topics (B.3.4): membership directories with relay-assigned `tp-` ids.
//!
//! - A non-member gets `404` for everything about a topic, exactly as for a topic that does
//!   not exist; a member who is not the owner gets `403` for owner-only actions.
//! - Ids and legacy names resolve through one store function, so both forms reach the same
//!   checks.

use std::collections::HashSet;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{delete, get, post};
use switchboard_core::util::now_ms;

use super::identities::identity_out;
use super::wire::{
    CreateTopicIn, MemberOut, MembersIn, MembersOut, RosterOut, TopicChangeOut, TopicCreatedOut, TopicOut, TopicsOut,
};
use super::{Caller, Other, SMALL_BODY, is_identity_id, json_object, json_response, new_topic_id, utc};
use crate::AppState;
use crate::error::{Conflict, Error};
use crate::store::stringcup::{
    AddMembers, AddOutcome, CreateTopic, DeleteOutcome, DeleteTopic, RemoveMember, RemoveOutcome, TopicCreated,
    TopicRow,
};

/// What a caller outside a topic is told about it, whether or not it exists.
const NO_TOPIC: &str = "no such topic";

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v2/topics", post(create).get(list).layer(DefaultBodyLimit::max(SMALL_BODY)))
        .route("/api/v2/topics/{topic}", get(roster).delete(remove_topic))
        .route("/api/v2/topics/{topic}/members", post(add).layer(DefaultBodyLimit::max(SMALL_BODY)))
        .route("/api/v2/topics/{topic}/members/{id}", delete(remove_member))
}

fn topic_out(row: &TopicRow, caller: &str) -> TopicOut {
    TopicOut {
        id: row.id.clone(),
        owner_id: row.owner.clone(),
        role: if row.owner == caller { "owner" } else { "member" }.into(),
        is_owner: row.owner == caller,
        member_count: row.member_count,
        created_at: utc(row.created_ms),
    }
}

async fn create(
    State(state): State<AppState>,
    caller: Caller<Other>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let req = json_object::<CreateTopicIn>(
        body,
        SMALL_BODY,
        true,
        &[("name", "the relay assigns topic ids; keep a human-readable label client-side (or inside the ciphertext)")],
    )?;
    let limits = &state.limits().stringcup;
    let (ids, malformed) = members(req.members.unwrap_or_default(), limits.topic_max_add)?;
    for _ in 0..4 {
        let id = new_topic_id();
        let now = now_ms();
        let create = CreateTopic {
            id: id.clone(),
            owner: caller.id.clone(),
            members: ids.clone(),
            max_members: u64::try_from(limits.topic_max_members).unwrap_or(u64::MAX),
            now,
        };
        match state.store().stringcup().create_topic(create).await? {
            TopicCreated::Created(initial) => {
                let member_count = i64::try_from(initial.members).unwrap_or(i64::MAX);
                let row = TopicRow { id, owner: caller.id.clone(), created_ms: now, member_count };
                let mut unknown = initial.unknown;
                unknown.extend(malformed);
                let body = TopicCreatedOut {
                    topic: topic_out(&row, &caller.id),
                    added: initial.added,
                    already_member: initial.already,
                    unknown,
                };
                return Ok(json_response(StatusCode::CREATED, &body));
            }
            TopicCreated::IdTaken => {}
            TopicCreated::NoCaller => return Err(Error::Unauthorized("unknown or revoked token")),
            TopicCreated::Full => return Err(Error::Conflict(Conflict::TopicFull(limits.topic_max_members))),
        }
    }
    Err(Error::Unavailable)
}

/// The ids of a member list, without repeats, split into well-formed and malformed (which can
/// name no identity, so they are reported as unknown); `400` past `max` ids.
fn members(list: Vec<String>, max: usize) -> Result<(Vec<String>, Vec<String>), Error> {
    if list.len() > max {
        return Err(Error::BadRequest(format!("at most {max} members may be added per call")));
    }
    let mut seen = HashSet::new();
    Ok(list.into_iter().filter(|id| seen.insert(id.clone())).partition(|id| is_identity_id(id)))
}

async fn list(State(state): State<AppState>, caller: Caller<Other>) -> Result<Response, Error> {
    let rows = state.store().stringcup().topics_of(&caller.id).await?;
    let topics: Vec<TopicOut> = rows.iter().map(|row| topic_out(row, &caller.id)).collect();
    Ok(json_response(StatusCode::OK, &TopicsOut { count: topics.len(), topics }))
}

fn path<T>(path: Result<Path<T>, PathRejection>) -> Result<T, Error> {
    path.map(|Path(p)| p).map_err(|e| Error::BadRequest(e.body_text()))
}

async fn roster(
    State(state): State<AppState>,
    caller: Caller<Other>,
    topic: Result<Path<String>, PathRejection>,
) -> Result<Response, Error> {
    let topic = path(topic)?;
    let store = state.store().stringcup();
    let row = store.topic_for_member(&topic, &caller.id).await?.ok_or(Error::NotFound(NO_TOPIC))?;
    let members: Vec<MemberOut> = store
        .roster(&row.id)
        .await?
        .iter()
        .map(|m| MemberOut {
            identity: identity_out(m),
            role: if m.id == row.owner { "owner" } else { "member" }.into(),
        })
        .collect();
    let body =
        RosterOut { id: row.id, owner_id: row.owner, created_at: utc(row.created_ms), count: members.len(), members };
    Ok(json_response(StatusCode::OK, &body))
}

async fn add(
    State(state): State<AppState>,
    caller: Caller<Other>,
    topic: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let topic = path(topic)?;
    let req = json_object::<MembersIn>(body, SMALL_BODY, false, &[])?;
    let limits = &state.limits().stringcup;
    let (ids, malformed) = members(req.members, limits.topic_max_add)?;
    let add = AddMembers {
        topic,
        caller: caller.id,
        ids,
        max_members: u64::try_from(limits.topic_max_members).unwrap_or(u64::MAX),
        now: now_ms(),
    };
    match state.store().stringcup().add_members(add).await? {
        AddOutcome::NotFound => Err(Error::NotFound(NO_TOPIC)),
        AddOutcome::NotOwner => Err(Error::Forbidden("only the topic's owner may add members")),
        AddOutcome::Full { .. } => Err(Error::Conflict(Conflict::TopicFull(limits.topic_max_members))),
        AddOutcome::Added { topic, added, already, mut unknown, members } => {
            // Malformed ids cannot name an identity: they are unknown, like any other.
            unknown.extend(malformed);
            let body = MembersOut { topic_id: topic, added, already_member: already, unknown, member_count: members };
            Ok(json_response(StatusCode::OK, &body))
        }
    }
}

async fn remove_member(
    State(state): State<AppState>,
    caller: Caller<Other>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, Error> {
    let (topic, member) = path(ids)?;
    let remove = RemoveMember { topic, caller: caller.id, member: member.clone() };
    match state.store().stringcup().remove_member(remove).await? {
        RemoveOutcome::NotFound => Err(Error::NotFound(NO_TOPIC)),
        RemoveOutcome::NotOwner => Err(Error::Forbidden("only the owner may remove other members")),
        RemoveOutcome::OwnerStays => Err(Error::Conflict(Conflict::OwnerStays)),
        RemoveOutcome::NotMember => Err(Error::NotFound("no such member of this topic")),
        RemoveOutcome::Removed(topic_id) => {
            let body = TopicChangeOut { status: "removed".into(), topic_id, member_id: Some(member) };
            Ok(json_response(StatusCode::OK, &body))
        }
    }
}

async fn remove_topic(
    State(state): State<AppState>,
    caller: Caller<Other>,
    topic: Result<Path<String>, PathRejection>,
) -> Result<Response, Error> {
    let topic = path(topic)?;
    match state.store().stringcup().delete_topic(DeleteTopic { topic, caller: caller.id }).await? {
        DeleteOutcome::NotFound => Err(Error::NotFound(NO_TOPIC)),
        DeleteOutcome::NotOwner => Err(Error::Forbidden("only the topic's owner may delete it")),
        DeleteOutcome::Deleted(topic_id) => {
            let body = TopicChangeOut { status: "deleted".into(), topic_id, member_id: None };
            Ok(json_response(StatusCode::OK, &body))
        }
    }
}
