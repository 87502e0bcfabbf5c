//! Limits, circuit breakers and aging on the durable store, shared by every process on the
//! database: the gated claim, the breaker's outcomes, and the aging update.
//!
//! # Design note: the gates
//!
//! A *gate* is what may hold a ready task back: its type's concurrency limit or token bucket, or
//! its downstream's circuit breaker. Every gate lives in a row of `tasq_gates`, one per gated
//! type and one per downstream, so that every process on the database sees (and moves) the same
//! limit and the same breaker. The rules are those of the embedded store (`limit.rs`,
//! `breaker.rs`), kept in rows:
//!
//! * A type's *concurrency limit* counts its rows that are `running`, whoever claimed them
//!   (claims held for a worker count; so does a row whose lease expired, until the reaper takes it
//!   back). The count is read under the lock of the type's row, after that lock is taken: a
//!   claimer that held the lock committed its claim before letting go, so the next one counts it.
//! * A type's *token bucket* is the row's `tokens` at `refilled_at` (NULL tokens: full), refilled
//!   at the rate up to the burst on `tasq_now()`, one token per claimed task. `refilled_at` only
//!   moves forward, so claimers whose clocks differ a little (each transaction reads `now()` as
//!   it began) never earn the same time twice.
//! * A downstream's *breaker* is the row's `state`, `consecutive` and `opened_at`, and its probe:
//!   the task running under `probe_lease`. The probe slot frees itself when that row stops running
//!   under that lease (its run ended, or its process died and the reaper took it back), so nothing
//!   has to be written for a run that says nothing about the downstream.
//!
//! # The gated claim
//!
//! A pool without gates claims in one statement (`dispatch::CLAIM`). A pool with gates claims in
//! one transaction, in rounds:
//!
//! 1. [`PICK`]: the best ready rows of the pool's types not yet excluded, `FOR UPDATE SKIP LOCKED`
//!    as the plain claim picks them. Rows of ungated types are claimed by the same statement; the
//!    rows of gated types come back as *candidates*, still locked and still ready.
//! 2. The gate rows of the candidates' types (and of their downstreams, unless closed) are locked
//!    ([`LOCK`]) with `SKIP LOCKED`: a gate that another claimer holds lets nothing of its types
//!    through this time, and the fetcher claims again a moment later. Never waiting for a gate
//!    row means no deadlock between claimers, whatever order their rounds lock gates in, and a
//!    claimer that stalls while it holds one (a process stopped mid-claim) holds back only that
//!    gate's types, never the other pools' whole claims. Then, in a new statement, so that its
//!    snapshot sees what the last holder of those locks committed, [`READ`] gives the running
//!    counts, the buckets and the breakers: each gated type's *allowance*.
//! 3. The candidates are kept in claim order while their type and downstream have allowance; a
//!    half-open breaker, or an open one past its cool-down, allows one task, the probe. The kept
//!    rows are claimed, the buckets drawn and the probes recorded, in one statement ([`CLAIM_KEPT`]).
//! 4. If a candidate was dropped (its type ran out of allowance) and the pick was full, another
//!    round picks without the exhausted types, so lower-priority work behind them is not left
//!    unclaimed. Each round excludes at least one more type, so the rounds end.
//!
//! Only a claim that *picks* a gated type's task locks that type's gate row, and no claim ever
//! waits for one. A closed breaker is read, not locked, so healthy traffic does not contend for
//! its row either; a breaker that opens while a claim reads it closed counts as opened just
//! after that claim, as on the embedded store.
//!
//! # Breaker outcomes
//!
//! A worker records its run's verdict before it writes the run's ending, in one statement that
//! checks the lease is still held and no cancel was asked for (either makes the run say nothing).
//! A success while closed with no failures counted touches no row (the statement's condition is
//! false before any lock is taken), so healthy successes never serialise on the row. Recording
//! first means that when a probe's row stops running, the breaker has already closed or reopened:
//! no second probe slips into the gap. Every change of state is made by one transaction, whose
//! process reports it once (`Event::Breaker`) after it commits.
//!
//! # Aging
//!
//! The claim orders by `priority` through the `tasq_dequeue` index, so aging raises `priority`
//! itself, in a periodic update ([`AGE`]) run by the fetcher before a claim and by the maintenance
//! thread, once per `every` on the pool's clock: a due ready row below the ceiling gets
//! `LEAST(ceiling, own + (tasq_now() - run_at) / every)`, its own priority kept in `base_priority`.
//! A claim never passes an update that was due when it began: if the maintenance thread has that
//! update in flight, the fetcher waits for it ([`age_if_due`](super::gating::age_if_due)). A row is written only when it earns
//! a level (at most `ceiling - own` times), and every return to `ready` (a retry, a give-back, the
//! reaper) restores its own priority. Equal effective priorities still run `run_at` first, then by
//! id.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use postgres::Row;

use super::conn::Sql;
use crate::gates::breaker::{Breaker, BreakerState};
use crate::gates::limit::RateLimit;
use crate::store::registry::Registry;

/// The pick's text, with a lane's filter or none.
macro_rules! pick_statement {
    // Passes over the limited queues' rows (claimed only under their rows' locks).
    ($lane:literal) => {
        pick_statement!(
            $lane,
            "AND (queue || '') <> ALL((SELECT limited FROM paused)::TEXT[])"
        )
    };
    ($lane:literal, $limited:literal) => {
        concat!(
            "
    WITH paused AS MATERIALIZED (SELECT * FROM tasq_paused()),
    picked AS (
        SELECT id, type, priority, run_at FROM tasq_tasks
        WHERE status = 'ready' AND run_at <= tasq_now() AND type = ANY($1) ",
            $lane,
            "
          -- `|| ''`: no statistics for the planner to read. With one type or one queue in
          -- the table, `column <> <unknown>` is estimated to keep no row, and the plan turns
          -- to a sequential scan and a sort (128 ms instead of 0.3 at 300,000 rows).
          AND (type || '') <> ALL((SELECT types FROM paused)::TEXT[])
          AND (queue || '') <> ALL((SELECT queues FROM paused)::TEXT[]) ",
            $limited,
            "
        ORDER BY priority DESC, run_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE tasq_tasks t
        SET status = 'running', lease_id = nextval('tasq_lease'),
            lease_until = now() + interval '1 microsecond' * $3::BIGINT,
            attempts = t.attempts + 1
        WHERE t.id = ANY(ARRAY(SELECT id FROM picked WHERE type <> ALL($4)))
        RETURNING t.id, t.type, t.payload, t.attempts, t.lease_id, t.priority, t.run_at,
                  t.max_attempts, t.retry_base_us, t.retry_cap_us, t.timeout_us
    )
    SELECT id, type, payload, attempts, lease_id, priority, run_at,
           max_attempts, retry_base_us, retry_cap_us, timeout_us FROM claimed
    UNION ALL
    SELECT id, type, NULL, NULL, NULL, priority, run_at, NULL, NULL, NULL, NULL
    FROM picked WHERE type = ANY($4)"
        )
    };
}

/// A pick of the best ready rows of the types `$1`, at most `$2`, as the plain claim picks them:
/// the rows of types not in `$4` (ungated) are claimed at once, leased for `$3` microseconds; the
/// rows of types in `$4` (gated) come back unclaimed (no lease), still locked by the transaction.
pub(crate) const PICK: &str = pick_statement!("");

/// The pick of a lane of workers (`Builder::queue`): as [`PICK`], of the rows in the queues
/// `$5` only.
pub(crate) const PICK_LANE: &str = pick_statement!("AND queue = ANY($5)");

/// The pick of a limited queue's rows (`queue_limits.rs`): as [`PICK_LANE`], of the limited
/// queue `$5` (one), in the transaction that holds its row's lock.
pub(crate) const PICK_LIMITED: &str = pick_statement!("AND queue = ANY($5)", "");

/// Locks the gate rows of the types `$1` and of the downstreams `$2` that are not closed, passing
/// over the rows another transaction holds (see the design note).
const LOCK: &str = "
    SELECT kind, name FROM tasq_gates
    WHERE (kind = 'type' AND name = ANY($1))
       OR (kind = 'downstream' AND name = ANY($2) AND state <> 'closed')
    ORDER BY kind, name
    FOR UPDATE SKIP LOCKED";

/// The gates of the types `$1` and the downstreams `$2`: each bucket with the seconds since its
/// refill, each breaker with the seconds since it opened and whether its probe still runs, and
/// the running rows of each type in `$3`.
pub(super) const READ: &str = "
    SELECT g.kind, g.name, g.tokens,
           EXTRACT(EPOCH FROM tasq_now() - g.refilled_at)::FLOAT8,
           g.state,
           EXTRACT(EPOCH FROM tasq_now() - g.opened_at)::FLOAT8,
           EXISTS (SELECT 1 FROM tasq_tasks t WHERE t.id = g.probe_task
                   AND t.lease_id = g.probe_lease AND t.status = 'running'),
           CASE WHEN g.kind = 'type' AND g.name = ANY($3) THEN
               (SELECT count(*) FROM tasq_tasks t
                WHERE t.status = 'running' AND t.type = g.name)
           END
    FROM tasq_gates g
    WHERE (g.kind = 'type' AND g.name = ANY($1)) OR (g.kind = 'downstream' AND g.name = ANY($2))";

/// Claims the kept rows `$1` (locked by this transaction), leased for `$2` microseconds; sets the
/// buckets of the types `$3` to the tokens `$4`, and makes each row of `$6` the probe of
/// downstream `$5` (half-open).
pub(super) const CLAIM_KEPT: &str = "
    WITH claimed AS (
        UPDATE tasq_tasks t
        SET status = 'running', lease_id = nextval('tasq_lease'),
            lease_until = now() + interval '1 microsecond' * $2::BIGINT,
            attempts = t.attempts + 1
        WHERE t.id = ANY($1) AND t.status = 'ready'
        RETURNING t.id, t.type, t.payload, t.attempts, t.lease_id, t.priority, t.run_at,
                  t.max_attempts, t.retry_base_us, t.retry_cap_us, t.timeout_us
    ), buckets AS (
        UPDATE tasq_gates g
        SET tokens = b.tokens, refilled_at = GREATEST(g.refilled_at, tasq_now())
        FROM unnest($3::TEXT[], $4::FLOAT8[]) AS b(name, tokens)
        WHERE g.kind = 'type' AND g.name = b.name
        RETURNING g.name
    ), probes AS (
        UPDATE tasq_gates g
        SET state = 'half_open', probe_task = c.id, probe_lease = c.lease_id
        FROM unnest($5::TEXT[], $6::BIGINT[]) AS p(name, id) JOIN claimed c ON c.id = p.id
        WHERE g.kind = 'downstream' AND g.name = p.name
        RETURNING g.name
    )
    SELECT id, type, payload, attempts, lease_id, priority, run_at,
           max_attempts, retry_base_us, retry_cap_us, timeout_us FROM claimed";

/// Makes the gate rows the pool uses, if missing: the types `$1` (a full bucket) and the
/// downstreams `$2` (closed).
const ENSURE: &str = "
    INSERT INTO tasq_gates (kind, name, refilled_at)
    SELECT 'type', name, tasq_now() FROM unnest($1::TEXT[]) AS name
    UNION ALL
    SELECT 'downstream', name, NULL FROM unnest($2::TEXT[]) AS name
    ON CONFLICT DO NOTHING";

/// A success of downstream `$1` by task `$2` under lease `$3`: closes the breaker and clears its
/// count, unless it is closed with no failure counted (then it touches nothing, and takes no
/// lock). Returns the state it was in. (A handler that ended its task in its own transaction,
/// `Context::succeed_in`, left the row succeeded under its lease.)
pub(super) const SUCCEEDED: &str = "
    WITH old AS (
        SELECT kind, name, state FROM tasq_gates
        WHERE kind = 'downstream' AND name = $1 AND (consecutive > 0 OR state <> 'closed')
          AND EXISTS (SELECT 1 FROM tasq_tasks t WHERE t.id = $2 AND t.lease_id = $3
                      AND (t.status = 'running' AND t.cancel_requested IS NULL
                           OR t.status = 'succeeded'))
        FOR UPDATE
    )
    UPDATE tasq_gates g
    SET state = 'closed', consecutive = 0, opened_at = NULL, probe_task = NULL, probe_lease = NULL
    FROM old WHERE g.kind = old.kind AND g.name = old.name
    RETURNING old.state, g.state";

/// A failure of downstream `$1` by task `$2` under lease `$3`: counts it, and opens the breaker
/// at `$4` consecutive failures while closed, or at once while half-open. Returns the state it
/// was in and the state it is in. (`old` is read under the row's lock: the latest version.)
pub(super) const FAILED: &str = "
    WITH old AS (
        SELECT kind, name, state, consecutive,
               state = 'half_open' OR (state = 'closed' AND consecutive + 1 >= $4) AS opens
        FROM tasq_gates
        WHERE kind = 'downstream' AND name = $1
          AND EXISTS (SELECT 1 FROM tasq_tasks t WHERE t.id = $2 AND t.lease_id = $3
                      AND t.status = 'running' AND t.cancel_requested IS NULL)
        FOR UPDATE
    )
    UPDATE tasq_gates g
    SET consecutive = LEAST(old.consecutive, 2147483646) + 1,
        state = CASE WHEN old.opens THEN 'open' ELSE old.state END,
        opened_at = CASE WHEN old.opens THEN tasq_now() ELSE g.opened_at END,
        probe_task = CASE WHEN old.opens THEN NULL ELSE g.probe_task END,
        probe_lease = CASE WHEN old.opens THEN NULL ELSE g.probe_lease END
    FROM old WHERE g.kind = old.kind AND g.name = old.name
    RETURNING old.state, g.state";

/// Aging: raises the due ready rows of the types `$1` below the ceiling `$2` to the level they
/// earned, one per `$3` microseconds since their `run_at` (at most 5,000 rows a priority). The
/// rows are found through `tasq_dequeue` one priority below the ceiling at a time (a skip scan
/// of its priorities), each priority's range read only as far as rows a level old, so the tasks
/// due far ahead are never read; only the rows to change are locked (`SKIP LOCKED`: a row a
/// claimer holds is on its way out of `ready`).
pub(crate) const AGE: &str = concat!(
    ready_priorities!("AND priority < $2::INT"),
    ", aged AS (
        SELECT a.id FROM prio, LATERAL (
            SELECT t.id FROM tasq_tasks t
            WHERE t.status = 'ready' AND t.priority = prio.p AND t.type = ANY($1)
              AND t.run_at <= tasq_now() - interval '1 microsecond' * $3::BIGINT
              AND LEAST($2::INT, COALESCE(t.base_priority, t.priority)
                      + (EXTRACT(EPOCH FROM tasq_now() - t.run_at) * 1000000)::BIGINT
                        / $3::BIGINT)
                  > t.priority
            ORDER BY t.run_at
            LIMIT 5000
            FOR UPDATE SKIP LOCKED) a
        WHERE prio.p IS NOT NULL
    )
    UPDATE tasq_tasks t
    SET base_priority = COALESCE(t.base_priority, t.priority),
        priority = LEAST($2::INT, COALESCE(t.base_priority, t.priority)
                   + (EXTRACT(EPOCH FROM tasq_now() - t.run_at) * 1000000)::BIGINT / $3::BIGINT)
    WHERE t.id = ANY(ARRAY(SELECT id FROM aged))"
);

/// How long to wait before claiming again when a gate row was busy or missing.
const SOON: Duration = Duration::from_millis(20);

// ===== the pool's gates =====

/// One registered type's gates.
#[derive(Clone, Copy, Debug)]
pub(super) struct TypeGate {
    pub(super) name: &'static str,
    pub(super) concurrency: Option<u32>,
    pub(super) rate: Option<RateLimit>,
    /// An index into `Gates::downstreams`.
    pub(super) downstream: Option<usize>,
}

impl TypeGate {
    /// Whether the type has a row of its own (a limit): its claims serialise on it.
    fn has_row(&self) -> bool {
        self.concurrency.is_some() || self.rate.is_some()
    }

    fn is_gated(&self) -> bool {
        self.has_row() || self.downstream.is_some()
    }
}

/// The gates of one pool, fixed when it is built.
#[derive(Debug)]
pub(super) struct Gates {
    /// By type index.
    pub(super) types: Vec<TypeGate>,
    /// Every breaker the pool set, in registry order.
    pub(super) downstreams: Vec<(&'static str, Breaker)>,
    /// The names of the gated types (the candidates of a pick).
    pub(super) gated: Vec<String>,
}

impl Gates {
    /// The pool's gates; `None` if it has none (it claims with the plain statement).
    pub(super) fn new(registry: &Registry) -> Option<Gates> {
        if !registry.has_gates() {
            return None;
        }
        let types: Vec<TypeGate> = registry
            .entries()
            .iter()
            .map(|entry| TypeGate {
                name: entry.name,
                concurrency: entry.concurrency,
                rate: entry.rate,
                downstream: entry.downstream.map(|d| d as usize),
            })
            .collect();
        let gated = types
            .iter()
            .filter(|t| t.is_gated())
            .map(|t| t.name.to_owned())
            .collect();
        Some(Gates {
            types,
            downstreams: registry.downstreams.clone(),
            gated,
        })
    }

    /// The names of the types with rows, and of every downstream.
    pub(super) fn row_names(&self) -> (Vec<&'static str>, Vec<&'static str>) {
        let types = self
            .types
            .iter()
            .filter(|t| t.has_row())
            .map(|t| t.name)
            .collect();
        let downstreams = self.downstreams.iter().map(|&(name, _)| name).collect();
        (types, downstreams)
    }
}

/// Makes the gate rows of `gates` that are missing (a bucket starts full).
pub(super) fn ensure_rows(client: &mut impl Sql, gates: &Gates) -> Result<(), postgres::Error> {
    let (types, downstreams) = gates.row_names();
    client.execute(ENSURE, &[&types, &downstreams])?;
    Ok(())
}

// ===== the gated claim =====

/// What held tasks back in a claim: when to claim again.
#[derive(Debug, Default)]
pub(super) struct Hold {
    /// A bucket holds its next token, or a breaker ends its cool-down, this long from now on the
    /// pool's clock.
    clock_wait: Option<Duration>,
    /// A gate row was busy or missing: claim again soon (real time).
    soon: bool,
}

impl Hold {
    fn wait(&mut self, wait: Duration) {
        self.clock_wait = Some(self.clock_wait.map_or(wait, |w| w.min(wait)));
    }

    /// The real instant the fetcher should claim again at, if a gate may reopen by itself.
    pub(super) fn wake_at(&self, manual_clock: bool) -> Option<Instant> {
        let now = Instant::now();
        // On a manual clock, time moves only when the test advances it, which wakes the fetcher.
        let by_clock = self
            .clock_wait
            .filter(|_| !manual_clock)
            .and_then(|wait| now.checked_add(wait));
        let soon = self.soon.then(|| now + SOON);
        match (by_clock, soon) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// A gated claim's result: the claimed rows (as the plain claim returns them), the breaker
/// changes it made (to report once committed), and what held tasks back.
pub(super) struct GatedClaim {
    pub(super) rows: Vec<Row>,
    pub(super) changes: Vec<(&'static str, BreakerState)>,
    pub(super) hold: Hold,
    /// A limited queue's row was another claimer's: nothing of it was claimed.
    pub(super) queue_busy: bool,
}

/// What a type may still start in this claim.
#[derive(Debug, Default)]
struct TypeRoom {
    /// Its concurrency limit's room (none: no limit).
    running_room: Option<u64>,
    /// Its bucket's tokens, refilled (none: no rate limit).
    pub(super) tokens: Option<f64>,
    /// Tokens drawn in this claim.
    drawn: u32,
}

impl TypeRoom {
    fn allowance(&self) -> u64 {
        let by_tokens = self
            .tokens
            .map(|t| ((t - f64::from(self.drawn)) + 1e-9).floor().max(0.0) as u64);
        match (self.running_room, by_tokens) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(u64::MAX),
        }
    }
}

/// What a downstream's breaker lets start in this claim.
#[derive(Debug)]
enum Pass {
    /// Closed: anything.
    Open,
    /// One probe; `true` if taking it moves the breaker from open to half-open.
    Probe(bool),
    /// Nothing, until `Hold` says.
    Shut,
}

/// The allowances read so far in one claim.
pub(super) struct Allowances<'a> {
    pub(super) gates: &'a Gates,
    /// Types whose gates were read, with their room.
    rooms: HashMap<u32, TypeRoom>,
    /// Downstreams whose breakers were read.
    passes: HashMap<usize, Pass>,
    /// Types not to pick again in this claim.
    pub(super) excluded: HashSet<u32>,
    /// Probes taken: downstream, row id, from open.
    pub(super) probes: Vec<(usize, i64, bool)>,
    pub(super) hold: Hold,
}

impl<'a> Allowances<'a> {
    pub(super) fn new(gates: &'a Gates) -> Self {
        Allowances {
            gates,
            rooms: HashMap::new(),
            passes: HashMap::new(),
            excluded: HashSet::new(),
            probes: Vec::new(),
            hold: Hold::default(),
        }
    }

    /// Locks and reads the gates of `types` not read yet.
    pub(super) fn read(&mut self, tx: &mut impl Sql, types: &[u32]) -> Result<(), postgres::Error> {
        let gates = self.gates;
        let mut type_names: Vec<&'static str> = Vec::new();
        let mut counted: Vec<&'static str> = Vec::new();
        let mut downstreams: Vec<usize> = Vec::new();
        for &index in types {
            if self.rooms.contains_key(&index) {
                continue;
            }
            let gate = gates.types[index as usize];
            if gate.has_row() {
                type_names.push(gate.name);
            }
            if gate.concurrency.is_some() {
                counted.push(gate.name);
            }
            if let Some(d) = gate.downstream {
                if !self.passes.contains_key(&d) && !downstreams.contains(&d) {
                    downstreams.push(d);
                }
            }
        }
        let ds_names: Vec<&'static str> = downstreams
            .iter()
            .map(|&d| gates.downstreams[d].0)
            .collect();
        let locked: HashSet<(String, String)> = if type_names.is_empty() && ds_names.is_empty() {
            HashSet::new()
        } else {
            tx.query(LOCK, &[&type_names, &ds_names])?
                .iter()
                .map(|row| (row.get(0), row.get(1)))
                .collect()
        };
        let read = if type_names.is_empty() && ds_names.is_empty() {
            Vec::new()
        } else {
            tx.query(READ, &[&type_names, &ds_names, &counted])?
        };
        let mut found: HashMap<(String, String), &Row> = HashMap::new();
        for row in &read {
            found.insert((row.get(0), row.get(1)), row);
        }
        let mut missing = false;
        for &index in types {
            if self.rooms.contains_key(&index) {
                continue;
            }
            let gate = gates.types[index as usize];
            let mut room = TypeRoom::default();
            if gate.has_row() {
                let key = ("type".to_owned(), gate.name.to_owned());
                match (found.get(&key), locked.contains(&key)) {
                    (Some(row), true) => {
                        if let Some(limit) = gate.concurrency {
                            let running: i64 = row.get::<_, Option<i64>>(7).unwrap_or(0);
                            let running = u64::try_from(running).unwrap_or(0);
                            room.running_room = Some(u64::from(limit).saturating_sub(running));
                        }
                        if let Some(rate) = gate.rate {
                            room.tokens = Some(refilled(row, &rate));
                        }
                    }
                    (found_row, _) => {
                        // Missing: made, then claimed again soon. Busy: another pool is
                        // claiming this type right now, and takes what room there is; this one
                        // claims again when a task of its own ends, or at its poll (claiming
                        // again soon, every pool at each busy row, was most of the empty
                        // claims of a limited type shared by many pools).
                        missing |= found_row.is_none();
                        self.hold.soon |= found_row.is_none();
                        room.running_room = Some(0);
                    }
                }
            }
            self.rooms.insert(index, room);
        }
        for d in downstreams {
            let (name, breaker) = gates.downstreams[d];
            let key = ("downstream".to_owned(), name.to_owned());
            let pass = match found.get(&key) {
                // No row yet: closed (the row is made below).
                None => {
                    missing = true;
                    Pass::Open
                }
                Some(row) => self.pass(row, &breaker, locked.contains(&key)),
            };
            self.passes.insert(d, pass);
        }
        if missing {
            let (types, downstreams) = gates.row_names();
            tx.execute(ENSURE, &[&types, &downstreams])?;
        }
        Ok(())
    }

    /// What breaker row `row` lets through (locked: this transaction holds its lock).
    fn pass(&mut self, row: &Row, breaker: &Breaker, locked: bool) -> Pass {
        let state = BreakerState::parse(row.get(4));
        if state == BreakerState::Closed {
            return Pass::Open;
        }
        if !locked {
            // Another claimer holds it (or it changed since the lock): next time.
            self.hold.soon = true;
            return Pass::Shut;
        }
        match state {
            BreakerState::Open => {
                // No time recorded: as if it opened long ago.
                let since = row.get::<_, Option<f64>>(5).unwrap_or(f64::INFINITY);
                let cool_down = breaker.cool_down().as_secs_f64();
                if since >= cool_down {
                    Pass::Probe(true)
                } else {
                    let left = Duration::try_from_secs_f64(cool_down - since).unwrap_or_default();
                    self.hold.wait(left + Duration::from_micros(1));
                    Pass::Shut
                }
            }
            // Half-open, its probe still running: its ending frees the slot (the probe's pool
            // claims next, other pools at their poll).
            _ if row.get::<_, bool>(6) => Pass::Shut,
            _ => Pass::Probe(false),
        }
    }

    /// Whether candidate `id` of type `index` may start; if so, it has (its allowances are
    /// drawn). A type that runs out is excluded from later picks.
    pub(super) fn take(&mut self, index: u32, id: i64) -> bool {
        if self.excluded.contains(&index) {
            return false;
        }
        let gate = self.gates.types[index as usize];
        let room = self.rooms.get(&index).map_or(u64::MAX, TypeRoom::allowance);
        let pass = gate
            .downstream
            .map(|d| (d, self.passes.get(&d).unwrap_or(&Pass::Open)));
        if room == 0 || matches!(pass, Some((_, Pass::Shut))) {
            self.note_held(index);
            self.exclude(index);
            return false;
        }
        if let Some(room) = self.rooms.get_mut(&index) {
            if let Some(r) = room.running_room.as_mut() {
                *r -= 1;
            }
            if room.tokens.is_some() {
                room.drawn += 1;
            }
        }
        if let Some((d, &Pass::Probe(from_open))) = pass {
            self.probes.push((d, id, from_open));
            // The probe holds the slot until it ends.
            self.passes.insert(d, Pass::Shut);
        }
        // Run out: not picked again in this claim (the fetcher hears why).
        let room = self.rooms.get(&index).map_or(u64::MAX, TypeRoom::allowance);
        let shut = gate
            .downstream
            .is_some_and(|d| matches!(self.passes.get(&d), Some(Pass::Shut)));
        if room == 0 || shut {
            self.note_held(index);
            self.exclude(index);
        }
        true
    }

    /// Records why type `index` holds a task back, for the fetcher's next wake-up (a breaker's
    /// reason was noted when it was read).
    fn note_held(&mut self, index: u32) {
        let gate = self.gates.types[index as usize];
        let Some(room) = self.rooms.get(&index) else {
            return;
        };
        if let (Some(tokens), Some(rate)) = (room.tokens, gate.rate) {
            let left = tokens - f64::from(room.drawn);
            if left < 1.0 - 1e-9 {
                let wait = (1.0 - left) / rate.starts_per_second();
                let wait = Duration::try_from_secs_f64(wait).unwrap_or(Duration::MAX);
                self.hold
                    .wait(wait.saturating_add(Duration::from_micros(1)));
            }
        }
    }

    /// Excludes `index` from later picks, with every type of its downstream if the breaker
    /// lets nothing more through.
    fn exclude(&mut self, index: u32) {
        self.excluded.insert(index);
        if let Some(d) = self.gates.types[index as usize].downstream {
            if matches!(self.passes.get(&d), Some(Pass::Shut)) {
                for (i, t) in self.gates.types.iter().enumerate() {
                    if t.downstream == Some(d) {
                        self.excluded.insert(i as u32);
                    }
                }
            }
        }
    }

    /// The buckets drawn in this round, to write: names and tokens left.
    pub(super) fn buckets(&self) -> (Vec<&'static str>, Vec<f64>) {
        let mut names = Vec::new();
        let mut tokens = Vec::new();
        for (&index, room) in &self.rooms {
            if let (Some(t), true) = (room.tokens, room.drawn > 0) {
                names.push(self.gates.types[index as usize].name);
                tokens.push((t - f64::from(room.drawn)).max(0.0));
            }
        }
        (names, tokens)
    }
}

/// A bucket's tokens now: `tokens` at `refilled_at` (NULL: full), refilled at the rate up to the
/// burst.
pub(super) fn refilled(row: &Row, rate: &RateLimit) -> f64 {
    let burst = f64::from(rate.burst());
    let Some(tokens) = row.get::<_, Option<f64>>(2) else {
        return burst;
    };
    let since = row.get::<_, Option<f64>>(3).unwrap_or(0.0).max(0.0);
    (tokens + since * rate.starts_per_second()).min(burst)
}

// ===== breaker outcomes =====

// ===== aging =====

/// When the aging update runs next, and whether one runs now.
#[derive(Debug, Default)]
pub(super) struct AgingTurn {
    /// When the next update is due, on the pool's clock (`None`: at once).
    pub(super) next: Option<Instant>,
    /// An update is in flight (its thread holds the turn).
    pub(super) running: bool,
}
