//! Every SQL statement in the profile store (`core/src/store`) and in relay-lite's SQLite store
//! (`relay-lite/src/store`, not `pg/`) reaches the tables that grow with use through an index:
//! `EXPLAIN QUERY PLAN` of each literal, on a database migrated to the current schema, with the
//! bundled SQLite the binaries use. A `SCAN` of a growing table fails the test unless the
//! statement is listed in `ALLOWED` with the reason.
//!
//! Why: a full scan costs nothing in a new profile and grows with every message. A dozen were
//! found at once (2026-12-05): the read frontier, the loop guards, leave requests, lookups by
//! contact and by id, lease acks, the Agent Mail sweep; each took 5-800 ms at 20,000-100,000
//! rows, on paths run for every message or every minute.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions as _, SqliteConnection};

/// Tables whose rows grow with messages, deliveries or time (the rest hold one row per contact,
/// agent, session, group, identity or pending send).
const GROWING: &[&str] = &[
    // profile
    "messages",
    "lmk_messages",
    "am_messages",
    "am_attachments",
    "agent_deliveries",
    "audit",
    "seen",
    "lmk_mls_rows",
    "lmk_expired",
    "lmk_epoch_auth",
    "asnet_replies",
    // relay-lite (its group logs are `lmk_messages` too)
    "la_envelope",
    "sc_message",
    "sc_idempotency",
    "sc_idempotency_keyed",
    "sc_pending_share",
    "am_packets",
];

/// Statements allowed to scan a growing table (a substring of the statement), and why.
const ALLOWED: &[(&str, &str)] = &[
    ("FROM audit WHERE ?1 IS NULL OR", "the audit log's text filter searches every row by nature (the user's look)"),
    (
        "SELECT (SELECT COUNT(*) FROM sc_identity)",
        "relay statistics count every table (an operator's look, on a reader)",
    ),
    ("INSERT INTO agent_floors", "an agent's queue starts once, from the newest incoming message"),
    (
        "INSERT INTO messages (",
        "the plan lists SQLite's check of `agent_deliveries` for a pending deferred foreign-key violation, \
         which never runs (the keys are immediate)",
    ),
    ("FROM asnet_replies WHERE type = ?", "one row per reply the ASNET service mailed; thousands at most"),
    ("SUM(size), 0) FROM am_attachments", "the attachment store's total, one row per attachment kept"),
];

/// The SQL string literals of every `.rs` file under `dir`: (file:line, statement), with Rust's
/// `\` line continuations joined.
fn statements(dir: &Path, skip: &[&str], out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if skip.iter().any(|s| path.ends_with(s)) {
            continue;
        }
        if path.is_dir() {
            statements(&path, skip, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut rest = text.as_str();
        while let Some(start) = rest.find('"') {
            let after = &rest[start + 1..];
            // The literal ends at the next quote not escaped.
            let mut end = None;
            let mut escaped = false;
            for (i, c) in after.char_indices() {
                match c {
                    '\\' if !escaped => escaped = true,
                    '"' if !escaped => {
                        end = Some(i);
                        break;
                    }
                    _ => escaped = false,
                }
            }
            let Some(end) = end else { break };
            let literal = &after[..end];
            let line = text.len() - rest.len() + start;
            let line = text[..line].matches('\n').count() + 1;
            rest = &after[end + 1..];
            let starts = ["SELECT ", "UPDATE ", "DELETE ", "INSERT ", "WITH "];
            if !starts.iter().any(|s| literal.starts_with(s)) {
                continue;
            }
            let mut sql = String::new();
            let mut lines = literal.split("\\\n");
            sql.push_str(lines.next().unwrap());
            for l in lines {
                sql.push_str(l.trim_start());
            }
            out.push((format!("{}:{line}", path.display()), sql.replace("\\\"", "\"")));
        }
    }
}

/// The scans of growing tables among `stmts`' plans (statements that do not parse against this
/// schema, e.g. those of another backend or built at run time, are skipped and counted).
async fn scans(conn: &mut SqliteConnection, stmts: &[(String, String)]) -> (Vec<String>, usize, usize) {
    let (mut found, mut planned, mut skipped) = (Vec::new(), 0, 0);
    for (at, sql) in stmts {
        // Parameters stay unbound (NULL): a plan does not depend on their values.
        let q = sqlx::query_as::<_, (i64, i64, i64, String)>(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")));
        let Ok(plan) = q.fetch_all(&mut *conn).await else {
            skipped += 1;
            continue;
        };
        planned += 1;
        if ALLOWED.iter().any(|(s, _)| sql.contains(s)) {
            continue;
        }
        for (_, _, _, step) in plan {
            let Some(table) = step.strip_prefix("SCAN ").and_then(|s| s.split_whitespace().next()) else { continue };
            if GROWING.contains(&table) {
                found.push(format!("{at}: {step}\n    {sql}"));
            }
        }
    }
    (found, planned, skipped)
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

#[tokio::test]
async fn no_profile_store_statement_scans_a_growing_table() {
    let dir = tempfile::tempdir().unwrap();
    let store = switchboard_core::store::Store::open(&dir.path().join("db.sqlite")).await.unwrap();
    let mut stmts = Vec::new();
    statements(&root().join("core/src/store"), &[], &mut stmts);
    let mut conn = store.pool.acquire().await.unwrap();
    let (found, planned, skipped) = scans(&mut conn, &stmts).await;
    assert!(planned > 200, "only {planned} statements planned ({skipped} skipped): is the extraction broken?");
    assert!(found.is_empty(), "full scans of growing tables:\n{}", found.join("\n"));
}

#[tokio::test]
async fn no_relay_sqlite_statement_scans_a_growing_table() {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = SqliteConnectOptions::new()
        .filename(dir.path().join("relay.sqlite3"))
        .create_if_missing(true)
        .connect()
        .await
        .unwrap();
    sqlx::migrate!("../relay-lite/migrations").run(&mut conn).await.unwrap();
    let mut stmts = Vec::new();
    statements(&root().join("relay-lite/src/store"), &["pg"], &mut stmts);
    let (found, planned, skipped) = scans(&mut conn, &stmts).await;
    assert!(planned > 60, "only {planned} statements planned ({skipped} skipped): is the extraction broken?");
    assert!(found.is_empty(), "full scans of growing tables:\n{}", found.join("\n"));
}
