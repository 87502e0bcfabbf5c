//! The database's clock for a pool on a [`ManualClock`](crate::ManualClock): `tasq_now()`'s
//! base and the session setting that carries the clock's time to SQL (see the folder's docs).

use std::time::{Duration, Instant};

use super::store::PgStore;
use crate::model::clock::Clock;
use crate::model::task::Start;

/// The database's time, in microseconds since the epoch, when the manual clock `clock` (moved
/// by `offset` so far) was made: the base of `tasq_now()` for the pools on it. Measured once per
/// clock in a process and kept, so that every pool sharing the clock shares one `tasq_now()`
/// exactly (their gates and due times agree to the microsecond).
pub(super) fn manual_base(
    client: &mut postgres::Client,
    clock: &Clock,
    offset: Duration,
) -> Result<i64, postgres::Error> {
    // A clock started at a wall-clock time of the test's choosing: that time is the base.
    if let Some(start) = clock.manual_wall_start() {
        let since = start
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return Ok(super::rows::micros(since));
    }
    static BASES: std::sync::Mutex<Vec<(Instant, i64)>> = std::sync::Mutex::new(Vec::new());
    // The real instant the clock was made: its reading less how far it moved (the same for
    // every clone of it).
    let made = clock.now().checked_sub(offset);
    let known = |made: Instant| {
        let bases = BASES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        bases
            .iter()
            .find(|(m, _)| *m == made)
            .map(|&(_, base)| base)
    };
    if let Some(base) = made.and_then(known) {
        return Ok(base);
    }
    let before = Instant::now();
    let now: i64 = client
        .query_one(
            "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT",
            &[],
        )?
        .get(0);
    let after = Instant::now();
    let read_at = before + after.duration_since(before) / 2;
    let Some(made) = made else {
        return Ok(now - super::rows::micros(offset));
    };
    let mut bases = BASES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Another pool on the clock may have measured it meanwhile: the first measure stands.
    if let Some(&(_, base)) = bases.iter().find(|(m, _)| *m == made) {
        return Ok(base);
    }
    let base = now - super::rows::micros(read_at.saturating_duration_since(made));
    bases.push((made, base));
    Ok(base)
}

impl PgStore {
    /// With a manual clock, its time now as `tasq_now()` reads it: microseconds since the
    /// epoch, on the database's time line (`None` on the system clock).
    pub(super) fn manual_now_us(&self) -> Option<i64> {
        let (base, offset) = (self.manual_base_us?, self.clock.manual_offset()?);
        Some(base.saturating_add(super::rows::micros(offset)))
    }

    /// Gives the statements that follow in a caller's transaction (`submit_in`, `succeed_in`)
    /// the pool's `tasq_now()`: with a manual clock, sets its time until the transaction ends
    /// (`set_config(.., true)`) and returns the caller's value, for
    /// [`restore_callers_now`](PgStore::restore_callers_now). Run inside a savepoint: if that
    /// rolls back, so does the setting.
    pub(super) fn set_callers_now(
        &self,
        tx: &mut postgres::Transaction<'_>,
    ) -> Result<Option<String>, postgres::Error> {
        let Some(now) = self.manual_now_us() else {
            return Ok(None);
        };
        let callers: Option<String> = tx
            .query_one("SELECT current_setting('tasq.manual_now_us', true)", &[])?
            .get(0);
        tx.execute(
            "SELECT set_config('tasq.manual_now_us', $1, true)",
            &[&now.to_string()],
        )?;
        // Unset and empty read alike (see `tasq_now()`).
        Ok(Some(callers.unwrap_or_default()))
    }

    /// Puts back the caller's value of the setting that
    /// [`set_callers_now`](PgStore::set_callers_now) replaced, so the rest of the caller's
    /// transaction reads its own `tasq_now()` again.
    pub(super) fn restore_callers_now(
        tx: &mut postgres::Transaction<'_>,
        callers: Option<String>,
    ) -> Result<(), postgres::Error> {
        if let Some(value) = callers {
            tx.execute(
                "SELECT set_config('tasq.manual_now_us', $1, true)",
                &[&value],
            )?;
        }
        Ok(())
    }

    /// The due time of a task that starts at a wall-clock time, as the row keeps it: that time
    /// itself, in microseconds since the epoch. The database compares it with its own clock,
    /// which every process of the fleet shares, instead of this process's idea of how far
    /// away it is: with the row, `run_at = GREATEST(that time, tasq_now())`, so a time the
    /// database's clock already passed is now, and ready tasks keep their order. `None` for
    /// other starts, and on a manual clock, whose `tasq_now()` is a test's time: the delay, as
    /// far ahead of now as the time is ahead of the wall clock, stands in for it then, as on
    /// the embedded store. A time before the epoch is long past: now.
    pub(super) fn wall_clock_due(&self, start: Start) -> Option<i64> {
        let Start::AtSystem(at) = start else {
            return None;
        };
        if self.manual_base_us.is_some() {
            return None;
        }
        let since_epoch = at.duration_since(std::time::UNIX_EPOCH).ok()?;
        // `prepare` refused what lies more than 584 years ahead: this fits.
        Some(super::rows::micros(since_epoch))
    }
}
