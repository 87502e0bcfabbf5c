//! Leader election: the maintenance that applies the queue's policy (the cleaner: retention and
//! dead-letter trimming) runs in one process of the fleet at a time, with fail-over.
//!
//! # The lease
//!
//! A role is a row of `tasq_leader`: its holder and when its lease expires, on the database's
//! clock. A pool's maintenance thread asks for the role before each pass; one statement takes
//! the row if it is free, expired, or already this pool's, and extends it by [`TERM`]. A leader
//! renews it every pass (about once a second), so it keeps the role while it lives; a leader
//! whose process dies or stalls stops renewing, and another pool takes the role once the term
//! runs out. A pool that shuts down gives the role up at once.
//!
//! A leader is only an optimisation: the cleaner's statements are correct run by two processes
//! at once (each deletes a batch of rows it found past the policy, and `SKIP LOCKED`-free
//! deletes of the same row simply wait for each other), so a leader that stalled past its term
//! while another took over does no harm when it resumes; it only wastes a pass.

use std::time::Duration;

use super::conn::Sql;
use super::rows;
use super::store::PgStore;

/// How long a role stays taken without a renewal: a dead leader's successor starts within this
/// much (plus a pass).
const TERM: Duration = Duration::from_secs(5);

/// The role that runs the cleaner.
pub(super) const CLEANER: &str = "cleaner";

/// One pool's claim to the roles: its name in `tasq_leader`, unique to the pool (the process
/// id, and a random part for the pools of one process).
pub(super) struct Candidate {
    holder: String,
}

impl Candidate {
    pub(super) fn new() -> Candidate {
        Candidate {
            holder: format!("{}:{:016x}", std::process::id(), {
                use rand::{RngCore, SeedableRng};
                rand::rngs::SmallRng::from_os_rng().next_u64()
            }),
        }
    }

    /// Takes or renews `role` for a term; whether this pool holds it now. `false` also when the
    /// database cannot be reached: a pool that cannot renew must assume another took over.
    pub(super) fn hold(&self, store: &PgStore, role: &str) -> bool {
        let held = store.with_conn(|c| {
            c.query_opt(
                "INSERT INTO tasq_leader (role, holder, expires_at)
                 VALUES ($1, $2, now() + interval '1 microsecond' * $3::BIGINT)
                 ON CONFLICT (role) DO UPDATE
                     SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
                     WHERE tasq_leader.holder = EXCLUDED.holder
                        OR tasq_leader.expires_at < now()
                 RETURNING holder",
                &[&role, &self.holder, &rows::micros(TERM)],
            )
        });
        matches!(held, Ok(Some(_)))
    }

    /// Gives `role` up if this pool holds it, so another pool takes it at its next pass.
    pub(super) fn resign(&self, store: &PgStore, role: &str) {
        let _ = store.with_conn(|c| {
            c.execute(
                "DELETE FROM tasq_leader WHERE role = $1 AND holder = $2",
                &[&role, &self.holder],
            )
        });
    }
}
