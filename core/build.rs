//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!` embeds
//! `migrations/` at compile time, and cargo does not otherwise know it reads that directory.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
