//! A real PostgreSQL for tests: Debian's server binaries, `initdb` in a temp dir (as the
//! `postgres` user when running as root), `pg_ctl start` on a loopback port, one cluster per test
//! process and a fresh database per test.
//!
//! Without PostgreSQL the tests that need it skip with a printed reason, or fail when
//! `SWITCHBOARD_REQUIRE_POSTGRES=1` (CI sets it). A watchdog shell stops the cluster and removes
//! its directory once the test process is gone.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::Connection as _;

/// A running cluster: its port and data directory.
#[derive(Debug)]
pub struct Cluster {
    pub port: u16,
    pub dir: PathBuf,
    bin: PathBuf,
    /// Server options beyond the socket, address, port and connection limit.
    extra: String,
}

/// The environment variable that turns a missing PostgreSQL into a failure.
pub const REQUIRE: &str = "SWITCHBOARD_REQUIRE_POSTGRES";

fn bin_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("SWITCHBOARD_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").is_file() && bin.join("pg_ctl").is_file())
        .collect();
    found.sort();
    found.pop()
}

fn is_root() -> bool {
    // SAFETY-free check: root owns /proc/self when running as uid 0.
    std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0).unwrap_or(false)
}

/// Runs a server binary as the `postgres` user when we are root (the server refuses root).
fn as_postgres(bin: &Path, tool: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
        c
    } else {
        Command::new(bin.join(tool))
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn start() -> Result<Cluster, String> {
    start_with("test", "-c fsync=off")
}

/// A cluster named `name` (its temp dir), started with the server options `extra`.
fn start_with(name: &str, extra: &str) -> Result<Cluster, String> {
    let bin =
        bin_dir().ok_or("no PostgreSQL server binaries under /usr/lib/postgresql (apt-get install postgresql)")?;
    let dir = std::env::temp_dir().join(format!("relay-lite-pg-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    if is_root() {
        let status = Command::new("chown").arg("postgres:").arg(&dir).status().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err("chown to the postgres user failed (is there a postgres user?)".into());
        }
    }
    let data = dir.join("data");
    let out = as_postgres(&bin, "initdb")
        .args(["-A", "trust", "--no-sync", "-U", "postgres", "-D"])
        .arg(&data)
        .stdout(Stdio::null())
        .output()
        .map_err(|e| format!("running initdb: {e}"))?;
    if !out.status.success() {
        return Err(format!("initdb failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let port = free_port();
    let options = format!("-k {} -h 127.0.0.1 -p {port} {extra} -c max_connections=300", dir.display());
    let out = as_postgres(&bin, "pg_ctl")
        .args(["-D"])
        .arg(&data)
        .args(["-w", "-l"])
        .arg(dir.join("log"))
        .args(["-o", &options, "start"])
        .stdout(Stdio::null())
        .output()
        .map_err(|e| format!("running pg_ctl: {e}"))?;
    if !out.status.success() {
        let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
        return Err(format!("pg_ctl start failed: {}{log}", String::from_utf8_lossy(&out.stderr)));
    }
    // Stop the cluster once this process is gone, however it ends.
    let stop = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {runuser} {pg_ctl} -D {data} -m immediate stop >/dev/null 2>&1; rm -rf {dir}",
        pid = std::process::id(),
        runuser = if is_root() { "runuser -u postgres --" } else { "" },
        pg_ctl = bin.join("pg_ctl").display(),
        data = data.display(),
        dir = dir.display(),
    );
    Command::new("sh")
        .args(["-c", &stop])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the watchdog: {e}"))?;
    Ok(Cluster { port, dir, bin, extra: extra.to_owned() })
}

/// The process's cluster, started on first use; `None` (with the reason printed) when there is
/// no PostgreSQL here, a panic when `SWITCHBOARD_REQUIRE_POSTGRES=1`.
pub fn cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    match CLUSTER.get_or_init(start) {
        Ok(c) => Some(c),
        Err(why) => {
            if std::env::var(REQUIRE).is_ok_and(|v| v == "1") {
                panic!("{REQUIRE}=1 but PostgreSQL cannot run here: {why}");
            }
            eprintln!("skipped: needs PostgreSQL: {why}");
            None
        }
    }
}

/// A cluster with PostgreSQL's durability defaults (`fsync=on`, `synchronous_commit=on`), for
/// benchmarks of durable writes; `None` with the reason printed when there is no PostgreSQL.
pub fn durable_cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    match CLUSTER.get_or_init(|| start_with("durable", "")) {
        Ok(c) => Some(c),
        Err(why) => {
            eprintln!("skipped: needs PostgreSQL: {why}");
            None
        }
    }
}

impl Cluster {
    /// The URL of database `name` on this cluster.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Creates a fresh, empty database and returns its URL.
    pub async fn fresh_database(&self) -> String {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!("t{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
        let mut admin = sqlx::PgConnection::connect(&self.url("postgres")).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut admin).await.unwrap();
        admin.close().await.unwrap();
        self.url(&name)
    }

    /// Stops the server (fast shutdown: every connection is cut).
    pub fn stop(&self) {
        let status = as_postgres(&self.bin, "pg_ctl")
            .args(["-D"])
            .arg(self.dir.join("data"))
            .args(["-m", "fast", "-w", "stop"])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "pg_ctl stop");
    }

    /// Starts it again on the same port.
    pub fn restart(&self) {
        let options =
            format!("-k {} -h 127.0.0.1 -p {} {} -c max_connections=300", self.dir.display(), self.port, self.extra);
        let status = as_postgres(&self.bin, "pg_ctl")
            .args(["-D"])
            .arg(self.dir.join("data"))
            .args(["-w", "-l"])
            .arg(self.dir.join("log"))
            .args(["-o", &options, "start"])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "pg_ctl start");
    }
}
