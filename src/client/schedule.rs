//! Periodic tasks: [`Schedule`], what a program gives
//! [`Builder::schedule`](crate::Builder::schedule) to have a task submitted at each slot, and
//! its check against the pool's registry. The rules are in `model/schedule.rs` (and
//! `model/cron.rs`), what each store keeps in `store/memory/schedules.rs` and
//! `store/postgres/schedules.rs`, the thread that ticks them in `runtime/scheduler.rs`, the
//! listing in `api/schedules.rs`.

use std::any::Any;
use std::fmt;
use std::time::{Duration, SystemTime};

use crate::model::error::BuildError;
use crate::model::schedule::{MAX_CATCH_UP, Missed, Spec};
use crate::model::task::TaskType;
use crate::store::registry::Registry;
use crate::store::schedule::{MakePayload, ScheduleDef};

/// Finds a schedule's task type in the registry: its index, or why not.
type Resolve = dyn Fn(&Registry) -> Result<u32, crate::model::error::SubmitErrorKind> + Send + Sync;

/// A periodic task: a task of one type submitted at each slot of a fixed interval or of a cron
/// expression in a time zone, with a payload made from the slot's time. Given to
/// [`Builder::schedule`](crate::Builder::schedule); the pool's scheduler thread submits its slots.
///
/// Slots are a function of the schedule alone (an interval's fall on the multiples of its
/// period since the Unix epoch; a cron expression's on its local times, resolved as
/// [`Schedule::cron`] says), so every process computes the same ones. The store remembers which
/// slots it decided: on the durable store each slot is submitted once across the fleet, on the
/// database's clock, whoever is killed mid-submit. A new schedule starts with the pool: no slot
/// before its first registration runs. Slots missed while the schedule could not run (the
/// process down, the schedule paused) follow its [`Missed`] policy.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use tasq::{HandlerError, ManualClock, Missed, Pool, Schedule, TaskType};
///
/// const SWEEP: TaskType<u64, ()> = TaskType::new("sweep");
/// let clock = ManualClock::new();
/// let (tx, rx) = crossbeam_channel::unbounded();
/// let pool = Pool::builder()
///     .manual_clock(clock.clone())
///     .register(SWEEP, move |_, slot: &u64| Ok::<_, HandlerError>(tx.send(*slot).unwrap()))
///     .schedule(
///         Schedule::every("sweep", Duration::from_secs(60), SWEEP, |slot: SystemTime| {
///             slot.duration_since(UNIX_EPOCH).unwrap().as_secs()
///         })
///         .missed(Missed::CatchUp(10)),
///     )
///     .build()?;
/// clock.advance(Duration::from_secs(60));
/// let slot = rx.recv()?;
/// assert_eq!(slot % 60, 0); // slots fall on whole minutes
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a schedule does nothing until given to `Builder::schedule`"]
pub struct Schedule {
    pub(super) name: &'static str,
    /// The spec, or why it is refused (told by `build`).
    spec: Result<Spec, String>,
    missed: Missed,
    grace: Duration,
    priority: u8,
    resolve: Box<Resolve>,
    make: Box<MakePayload>,
}

impl Schedule {
    /// Submits a `ty` task every `period`, at each multiple of it since the Unix epoch (a
    /// 60-second period falls on whole minutes, UTC), with the payload `payload` makes from the
    /// slot's time. The period must be at least a millisecond, in whole microseconds (another
    /// makes the build fail with [`BuildError::InvalidSchedule`]).
    ///
    /// `payload` is user code: the scheduler calls it with no lock held, inside `catch_unwind`.
    /// If it panics, the slot submits no task, and the listing says why
    /// ([`ScheduleInfo::last_error`](crate::ScheduleInfo::last_error)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{Schedule, TaskType};
    ///
    /// const REFRESH: TaskType<String, ()> = TaskType::new("refresh");
    /// // A fixed payload: the same every slot.
    /// let schedule = Schedule::every("refresh-cache", Duration::from_secs(300), REFRESH, |_| "all".to_owned());
    /// # let _ = schedule;
    /// ```
    pub fn every<P, O, F>(
        name: &'static str,
        period: Duration,
        ty: TaskType<P, O>,
        payload: F,
    ) -> Schedule
    where
        P: Send + 'static,
        O: 'static,
        F: Fn(SystemTime) -> P + Send + Sync + 'static,
    {
        let spec = if period < Duration::from_millis(1) {
            Err("has a period under a millisecond".to_owned())
        } else if period.subsec_nanos() % 1_000 != 0 {
            Err("has a period that is not a whole number of microseconds".to_owned())
        } else {
            Ok(Spec::Every(period))
        };
        Schedule::new(name, spec, ty, payload)
    }

    /// Submits a `ty` task at each local time that the cron `expression` matches in time zone
    /// `zone`, with the payload `payload` makes from the slot's time (see
    /// [`every`](Schedule::every)). Feature `cron`.
    ///
    /// The expression has the standard five fields (minute, hour, day of month, month, day of
    /// week), with names (`MON`, `JAN`), ranges, steps, lists, and `L`, `#` and `W`; the zone is
    /// an IANA name (`"Europe/Berlin"`, `"America/New_York"`, `"UTC"`), from the time-zone
    /// database compiled into the crate. Either one wrong makes the build fail with
    /// [`BuildError::InvalidSchedule`].
    ///
    /// Daylight saving: a local time that does not exist (02:30 on the day clocks jump from
    /// 02:00 to 03:00) runs when the clock jumps past it, at 03:00; a local time that happens
    /// twice (02:30 on the day clocks fall back from 03:00 to 02:00) runs once, at its first
    /// pass. So a daily slot is neither skipped nor doubled; an hourly schedule has slots at
    /// 03:00 and 03:30 on the spring day, and none in the repeated hour of the autumn one.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{Schedule, TaskType};
    ///
    /// const REPORT: TaskType<(), ()> = TaskType::new("report");
    /// let weekdays = Schedule::cron("morning-report", "0 9 * * MON-FRI", "Europe/Berlin", REPORT, |_| ());
    /// # let _ = weekdays;
    /// ```
    #[cfg(feature = "cron")]
    pub fn cron<P, O, F>(
        name: &'static str,
        expression: &str,
        zone: &str,
        ty: TaskType<P, O>,
        payload: F,
    ) -> Schedule
    where
        P: Send + 'static,
        O: 'static,
        F: Fn(SystemTime) -> P + Send + Sync + 'static,
    {
        let spec = crate::model::cron::CronSpec::parse(expression, zone)
            .map(|cron| Spec::Cron(Box::new(cron)));
        Schedule::new(name, spec, ty, payload)
    }

    fn new<P, O, F>(
        name: &'static str,
        spec: Result<Spec, String>,
        ty: TaskType<P, O>,
        payload: F,
    ) -> Schedule
    where
        P: Send + 'static,
        O: 'static,
        F: Fn(SystemTime) -> P + Send + Sync + 'static,
    {
        Schedule {
            name,
            spec,
            missed: Missed::default(),
            grace: Duration::from_secs(60),
            priority: 0,
            resolve: Box::new(move |registry| registry.type_index(ty)),
            make: Box::new(move |slot| Box::new(payload(slot)) as Box<dyn Any + Send>),
        }
    }

    /// What to do with missed slots (see [`Missed`]). Defaults to [`Missed::RunOnce`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{Missed, Schedule, TaskType};
    ///
    /// const ROLLUP: TaskType<(), ()> = TaskType::new("rollup");
    /// let hourly = Schedule::every("rollup", Duration::from_secs(3600), ROLLUP, |_| ()).missed(Missed::CatchUp(24));
    /// # let _ = hourly;
    /// ```
    pub fn missed(mut self, missed: Missed) -> Schedule {
        self.missed = missed;
        self
    }

    /// How late a slot may be and still run under [`Missed::Skip`]. Defaults to a minute.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{Missed, Schedule, TaskType};
    ///
    /// const PING: TaskType<(), ()> = TaskType::new("ping");
    /// let ping = Schedule::every("ping", Duration::from_secs(10), PING, |_| ())
    ///     .missed(Missed::Skip)
    ///     .grace(Duration::from_secs(5));
    /// # let _ = ping;
    /// ```
    pub fn grace(mut self, grace: Duration) -> Schedule {
        self.grace = grace;
        self
    }

    /// The priority of the tasks it submits (see [`Task::priority`](crate::Task::priority)).
    /// Defaults to 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{Schedule, TaskType};
    ///
    /// const BEAT: TaskType<(), ()> = TaskType::new("beat");
    /// let urgent = Schedule::every("beat", Duration::from_secs(1), BEAT, |_| ()).priority(9);
    /// # let _ = urgent;
    /// ```
    pub fn priority(mut self, priority: u8) -> Schedule {
        self.priority = priority;
        self
    }

    /// The schedule's name.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{Schedule, TaskType};
    ///
    /// const BEAT: TaskType<(), ()> = TaskType::new("beat");
    /// assert_eq!(Schedule::every("beat", Duration::from_secs(1), BEAT, |_| ()).name(), "beat");
    /// ```
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Checks the schedule against the pool's registry.
    pub(crate) fn check(self, registry: &Registry) -> Result<ScheduleDef, BuildError> {
        let name = self.name;
        let refuse = move |problem: String| BuildError::InvalidSchedule {
            schedule: name,
            problem,
        };
        if let Err(problem) = crate::model::pause::check_queue_name(self.name) {
            return Err(refuse(format!("has a name that {problem}")));
        }
        let spec = self.spec.clone().map_err(refuse)?;
        if let Missed::CatchUp(max) = self.missed {
            if max == 0 || max > MAX_CATCH_UP {
                return Err(refuse(format!(
                    "catches up {max} slots: 1 to {MAX_CATCH_UP}"
                )));
            }
        }
        let type_index = (self.resolve)(registry)
            .map_err(|kind| refuse(format!("submits a task the pool cannot take: {kind}")))?;
        let settings = registry.entry(type_index).settings();
        let Schedule {
            name,
            missed,
            grace,
            priority,
            make,
            resolve,
            ..
        } = self;
        crate::unwind::drop_quietly(resolve);
        Ok(ScheduleDef::new(
            name, spec, missed, grace, type_index, priority, settings, make,
        ))
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("name", &self.name)
            .field("spec", &self.spec.as_ref().map(Spec::definition))
            .field("missed", &self.missed)
            .field("grace", &self.grace)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

/// Checks every schedule of a builder against its registry.
pub(crate) fn check_all(
    schedules: Vec<Schedule>,
    registry: &Registry,
) -> Result<Vec<ScheduleDef>, BuildError> {
    let mut defs: Vec<ScheduleDef> = Vec::with_capacity(schedules.len());
    for schedule in schedules {
        if defs.iter().any(|d| d.name == schedule.name) {
            return Err(BuildError::InvalidSchedule {
                schedule: schedule.name,
                problem: "is added twice".to_owned(),
            });
        }
        defs.push(schedule.check(registry)?);
    }
    Ok(defs)
}
