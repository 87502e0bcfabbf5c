//! The listing of a pool's periodic tasks ([`Pool::schedules`]); the schedules themselves are
//! `client/schedule.rs`.

use crate::api::pool::Pool;
use crate::model::error::StatsError;
use crate::model::schedule::ScheduleInfo;

impl Pool {
    /// The pool's schedules: on the durable store, every schedule the fleet runs (one entry per
    /// definition while a rolling deploy changes one), with its next and last slot, the last
    /// slot's task and that task's state, and whether it is paused. Pause a schedule with
    /// [`Pool::pause`] and [`PauseTarget::Schedule`](crate::PauseTarget::Schedule).
    ///
    /// # Errors
    ///
    /// [`StatsError::StoreUnavailable`] if the durable store's database could not be read.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, PauseTarget, Pool, Schedule, TaskType};
    ///
    /// const BEAT: TaskType<(), ()> = TaskType::new("beat");
    /// let pool = Pool::builder()
    ///     .register(BEAT, |_, _: &()| Ok::<_, HandlerError>(()))
    ///     .schedule(Schedule::every("beat", Duration::from_secs(30), BEAT, |_| ()))
    ///     .build()?;
    /// pool.pause(PauseTarget::schedule("beat"))?;
    /// let listed = pool.schedules()?;
    /// assert_eq!((listed[0].name.as_str(), listed[0].paused), ("beat", true));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn schedules(&self) -> Result<Vec<ScheduleInfo>, StatsError> {
        self.store.schedules().map_err(StatsError::StoreUnavailable)
    }
}
