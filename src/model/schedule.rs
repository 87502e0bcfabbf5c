//! Periodic tasks' rules, pure: when a schedule's slots fall ([`Spec`]: a fixed interval, or a
//! cron expression in a time zone), which of the due slots a tick submits ([`Missed`]), and what
//! a listing of schedules says ([`ScheduleInfo`]).
//!
//! A **slot** is one due time of a schedule, an instant on the wall clock (UTC). Slots are a
//! function of the schedule alone, never of when a process started or last looked: an interval's
//! slots are the multiples of its period since the Unix epoch, a cron expression's are the
//! instants its matching local times resolve to (see `cron.rs` for the daylight-saving rules).
//! So every process of a fleet computes the same slots, whatever its clock, and a store can make
//! each slot happen once by remembering which it made.
//!
//! A store keeps, for each schedule, a **watermark**: every slot at or before it has been
//! decided (submitted or skipped). A tick reads the time `now` (the database's, on the durable
//! store) and decides the slots in `(watermark, now]` by the schedule's [`Missed`] policy, then
//! moves the watermark to the newest of them. A new schedule's watermark is the time it was
//! first registered: no slot before it runs.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::model::id::TaskId;
use crate::model::state::TaskState;

/// The most slots [`Missed::CatchUp`] may submit in one tick.
pub const MAX_CATCH_UP: u32 = 10_000;

/// What a schedule does with slots it missed (the process was down, the schedule paused, the
/// database away): the slots in `(watermark, now]` older than the newest.
///
/// The newest due slot is always a candidate; the policies differ in what they do with the
/// ones before it, and with a newest slot that is itself late.
///
/// # Examples
///
/// ```
/// use tasq::Missed;
///
/// // Send the daily report once when the service comes back, however long it was down.
/// let report = Missed::RunOnce;
/// // Every hourly rollup must run, but never more than a day's worth at once.
/// let rollups = Missed::CatchUp(24);
/// # let _ = (report, rollups);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Missed {
    /// Only the newest due slot, and only if it is no older than the schedule's grace
    /// ([`Schedule::grace`](crate::Schedule::grace), a minute by default): slots missed by
    /// more are dropped.
    Skip,
    /// The newest due slot, however late; the ones before it are dropped. The default.
    #[default]
    RunOnce,
    /// Every due slot, oldest first, but at most this many of the newest (1 to
    /// [`MAX_CATCH_UP`]); older ones are dropped.
    CatchUp(u32),
}

impl Missed {
    /// How many of the newest due slots a tick may submit.
    pub(crate) fn keep(self) -> usize {
        match self {
            Missed::Skip | Missed::RunOnce => 1,
            Missed::CatchUp(max) => max as usize,
        }
    }
}

impl fmt::Display for Missed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Missed::Skip => f.write_str("skip"),
            Missed::RunOnce => f.write_str("run-once"),
            Missed::CatchUp(max) => write!(f, "catch-up {max}"),
        }
    }
}

/// When a schedule's slots fall.
#[derive(Clone, Debug)]
pub(crate) enum Spec {
    /// Every multiple of `period` since the Unix epoch.
    Every(Duration),
    #[cfg(feature = "cron")]
    Cron(Box<crate::model::cron::CronSpec>),
}

impl Spec {
    /// The first slot strictly after `t`, if any (a cron expression may have none left).
    pub(crate) fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        match self {
            Spec::Every(period) => {
                let period = period.as_nanos();
                let since = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
                let k = since / period + 1;
                from_nanos(k.checked_mul(period)?)
            }
            #[cfg(feature = "cron")]
            Spec::Cron(cron) => cron.next_after(t),
        }
    }

    /// The newest `keep` slots in `(after, until]`, oldest first.
    pub(crate) fn newest(
        &self,
        after: SystemTime,
        until: SystemTime,
        keep: usize,
    ) -> Vec<SystemTime> {
        match self {
            Spec::Every(period) => {
                let p = period.as_nanos();
                let nanos =
                    |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
                let (after, until) = (nanos(after), nanos(until));
                let mut k = until / p;
                let mut slots = Vec::new();
                while slots.len() < keep && k.checked_mul(p).is_some_and(|at| at > after) {
                    slots.extend(from_nanos(k * p));
                    if k == 0 {
                        break;
                    }
                    k -= 1;
                }
                slots.reverse();
                slots
            }
            #[cfg(feature = "cron")]
            Spec::Cron(_) => self.newest_by_walking(after, until, keep),
        }
    }

    /// [`newest`](Spec::newest) for a spec that can only step forward: from a start far
    /// enough back to hold `keep` slots (found by widening a window from `until`), or from
    /// `after`, whichever is later. Bounded by the slots walked, not by how far back `after` is.
    #[cfg(feature = "cron")]
    fn newest_by_walking(
        &self,
        after: SystemTime,
        until: SystemTime,
        keep: usize,
    ) -> Vec<SystemTime> {
        let walk = |from: SystemTime, stop_at: Option<usize>| {
            let mut slots = std::collections::VecDeque::new();
            let mut at = from;
            while let Some(next) = self.next_after(at).filter(|&n| n <= until) {
                slots.push_back(next);
                if slots.len() > keep {
                    slots.pop_front();
                }
                if stop_at.is_some_and(|n| slots.len() >= n) {
                    break;
                }
                at = next;
            }
            slots
        };
        let mut window = Duration::from_secs(3600);
        let start = loop {
            match until.checked_sub(window).filter(|&start| start > after) {
                None => break after,
                Some(start) if walk(start, Some(keep)).len() >= keep => break start,
                Some(_) => window = window.saturating_mul(4),
            }
        };
        walk(start, None).into()
    }

    /// The spec's canonical text: what a durable store keeps to tell definitions apart.
    pub(crate) fn definition(&self) -> String {
        match self {
            Spec::Every(period) => format!("every {}us", period.as_micros()),
            #[cfg(feature = "cron")]
            Spec::Cron(cron) => cron.definition(),
        }
    }

    /// A spec read back from its [`definition`](Spec::definition) (a listing of the durable
    /// store's schedules); `None` if this build cannot read it (a cron expression without the
    /// `cron` feature).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn from_definition(text: &str) -> Option<Spec> {
        if let Some(micros) = text
            .strip_prefix("every ")
            .and_then(|t| t.strip_suffix("us"))
        {
            let micros: u64 = micros.parse().ok()?;
            return (micros > 0).then(|| Spec::Every(Duration::from_micros(micros)));
        }
        #[cfg(feature = "cron")]
        if let Some(cron) = crate::model::cron::CronSpec::from_definition(text) {
            return Some(Spec::Cron(Box::new(cron)));
        }
        None
    }
}

fn from_nanos(nanos: u128) -> Option<SystemTime> {
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// Which slots one tick submits, by the schedule's policy (see the module docs).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Due {
    /// To submit, oldest first.
    pub(crate) submit: Vec<SystemTime>,
    /// The watermark after the tick: the newest due slot, or the old watermark if none was due.
    pub(crate) watermark: SystemTime,
}

/// Decides the slots in `(watermark, now]` (see the module docs).
pub(crate) fn due(
    spec: &Spec,
    missed: Missed,
    grace: Duration,
    watermark: SystemTime,
    now: SystemTime,
) -> Due {
    let mut submit = spec.newest(watermark, now, missed.keep());
    let Some(&newest) = submit.last() else {
        return Due { submit, watermark };
    };
    if missed == Missed::Skip && now.duration_since(newest).unwrap_or_default() > grace {
        submit.clear();
    }
    Due {
        submit,
        watermark: newest,
    }
}

/// One schedule, as [`Pool::schedules`](crate::Pool::schedules) lists it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::{Pool, Schedule, TaskType};
///
/// const TICK: TaskType<(), ()> = TaskType::new("tick");
/// let pool = Pool::builder()
///     .register(TICK, |_, _: &()| Ok::<_, tasq::HandlerError>(()))
///     .schedule(Schedule::every("tick", Duration::from_secs(60), TICK, |_| ()))
///     .build()?;
/// let listed = pool.schedules()?;
/// assert_eq!(listed[0].name, "tick");
/// assert!(listed[0].next_slot.is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// The schedule's name.
    pub name: String,
    /// When its slots fall, as text (`every 60000000us`, `cron 0 9 * * * in Europe/Berlin`).
    /// On the durable store, during a rolling deploy that changes a schedule, each definition
    /// running in the fleet is listed.
    pub definition: String,
    /// The next slot after the watermark (`None`: none left, or a definition this build cannot
    /// read).
    pub next_slot: Option<SystemTime>,
    /// The newest slot submitted (or whose payload failed to be made).
    pub last_slot: Option<SystemTime>,
    /// The task that slot submitted.
    pub last_task: Option<TaskId>,
    /// That task's state now (`None`: no task, or one the store has forgotten).
    pub last_state: Option<TaskState>,
    /// Why that slot submitted no task: its payload function panicked, or the submit was refused.
    pub last_error: Option<String>,
    /// Whether the schedule is paused ([`PauseTarget::Schedule`](crate::PauseTarget::Schedule)).
    pub paused: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn an_interval_falls_on_multiples_of_its_period() {
        let every = Spec::Every(Duration::from_secs(60));
        assert_eq!(every.next_after(at(0)), Some(at(60)));
        assert_eq!(every.next_after(at(59)), Some(at(60)));
        assert_eq!(every.next_after(at(60)), Some(at(120)));
        assert_eq!(every.newest(at(60), at(60), 5), Vec::<SystemTime>::new());
        assert_eq!(every.newest(at(59), at(60), 5), vec![at(60)]);
        assert_eq!(every.newest(at(0), at(299), 2), vec![at(180), at(240)]);
        assert_eq!(
            every.newest(at(0), at(299), 9),
            vec![at(60), at(120), at(180), at(240)]
        );
    }

    #[test]
    fn the_policies_decide_the_missed_slots() {
        let every = Spec::Every(Duration::from_secs(10));
        let grace = Duration::from_secs(5);
        // On time: one slot, whatever the policy.
        for missed in [Missed::Skip, Missed::RunOnce, Missed::CatchUp(3)] {
            let due = due(&every, missed, grace, at(100), at(112));
            assert_eq!(due.submit, vec![at(110)], "{missed}");
            assert_eq!(due.watermark, at(110));
        }
        // Down from 100 to 147.
        let d = due(&every, Missed::Skip, grace, at(100), at(147));
        assert_eq!((d.submit, d.watermark), (vec![], at(140)));
        let d = due(&every, Missed::Skip, grace, at(100), at(144));
        assert_eq!((d.submit, d.watermark), (vec![at(140)], at(140)));
        // Exactly its grace late: still on time.
        let d = due(&every, Missed::Skip, grace, at(100), at(145));
        assert_eq!((d.submit, d.watermark), (vec![at(140)], at(140)));
        let d = due(&every, Missed::RunOnce, grace, at(100), at(147));
        assert_eq!((d.submit, d.watermark), (vec![at(140)], at(140)));
        let d = due(&every, Missed::CatchUp(3), grace, at(100), at(147));
        assert_eq!(
            (d.submit, d.watermark),
            (vec![at(120), at(130), at(140)], at(140))
        );
        let d = due(&every, Missed::CatchUp(10), grace, at(100), at(147));
        assert_eq!(d.submit, vec![at(110), at(120), at(130), at(140)]);
        // Nothing due: the watermark stays.
        let d = due(&every, Missed::CatchUp(10), grace, at(100), at(109));
        assert_eq!((d.submit, d.watermark), (vec![], at(100)));
    }

    #[cfg(feature = "cron")]
    #[test]
    fn a_cron_spec_finds_its_newest_slots_however_far_back_the_watermark_is() {
        let cron = crate::model::cron::CronSpec::parse("*/10 * * * *", "UTC").unwrap();
        let cron = Spec::Cron(Box::new(cron));
        let t = 1_800_000_000; // 08:00:00 UTC, a multiple of ten minutes
        assert_eq!(
            cron.newest(at(t), at(t + 1799), 5),
            vec![at(t + 600), at(t + 1200)]
        );
        assert_eq!(
            cron.newest(at(t), at(t + 1800), 2),
            vec![at(t + 1200), at(t + 1800)]
        );
        // A watermark three days back: the window widens until it holds two slots.
        assert_eq!(
            cron.newest(at(t - 3 * 86_400), at(t), 2),
            vec![at(t - 600), at(t)]
        );
        assert_eq!(cron.newest(at(t - 3 * 86_400), at(t), 1), vec![at(t)]);
        // Fewer slots since the watermark than asked for: all of them.
        assert_eq!(
            cron.newest(at(t - 1500), at(t), 10),
            vec![at(t - 1200), at(t - 600), at(t)]
        );
        // A day's worth, from a watermark a week back.
        let day = cron.newest(at(t - 7 * 86_400), at(t), 144);
        assert_eq!(
            (day.len(), day[0], day[143]),
            (144, at(t - 86_400 + 600), at(t))
        );
        // Nothing due.
        assert_eq!(cron.newest(at(t), at(t + 599), 3), Vec::<SystemTime>::new());
        assert_eq!(cron.newest(at(t), at(t), 3), Vec::<SystemTime>::new());
        assert_eq!(cron.newest(at(t + 5), at(t), 3), Vec::<SystemTime>::new());
    }

    #[test]
    fn policies_print_as_the_durable_store_names_them() {
        assert_eq!(Missed::Skip.to_string(), "skip");
        assert_eq!(Missed::RunOnce.to_string(), "run-once");
        assert_eq!(Missed::CatchUp(24).to_string(), "catch-up 24");
        assert_eq!((Missed::Skip.keep(), Missed::CatchUp(24).keep()), (1, 24));
    }

    #[test]
    fn definitions_read_back() {
        let every = Spec::Every(Duration::from_millis(1500));
        assert_eq!(every.definition(), "every 1500000us");
        let back = Spec::from_definition(&every.definition()).unwrap();
        assert_eq!(back.definition(), every.definition());
        assert!(Spec::from_definition("every 0us").is_none());
        assert!(Spec::from_definition("every soonus").is_none());
        assert!(Spec::from_definition("whenever").is_none());
    }
}
