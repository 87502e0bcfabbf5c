//! A periodic task's schedule as it crosses the seam: [`ScheduleDef`] (the rules, the task type
//! and the function that makes a slot's payload, type-erased) and what one tick of it did
//! ([`Tick`]). How a slot's task enters a store (`MadePayload`, `ScheduleDef::submission`) is
//! beside the other submissions, in `mod.rs`. Each store keeps its schedules' watermarks and ticks them (`memory/schedules.rs`,
//! `postgres/schedules.rs`); the runtime's scheduler thread decides when (`runtime/scheduler.rs`);
//! the rules are `model/schedule.rs`.

use std::any::Any;
use std::fmt;
use std::time::{Duration, SystemTime};

use crate::model::schedule::{Missed, Spec};
use crate::store::registry::Settings;
use crate::unwind;

/// Makes a slot's payload from the slot's time (user code).
pub(crate) type MakePayload = dyn Fn(SystemTime) -> Box<dyn Any + Send> + Send + Sync;

/// One schedule, checked by the builder.
pub(crate) struct ScheduleDef {
    pub(crate) name: &'static str,
    pub(crate) spec: Spec,
    pub(crate) missed: Missed,
    pub(crate) grace: Duration,
    pub(crate) type_index: u32,
    pub(crate) priority: u8,
    /// The type's settings, as this pool registered it.
    pub(crate) settings: Settings,
    /// Always `Some` until dropped (see `Drop`).
    make: Option<Box<MakePayload>>,
}

impl ScheduleDef {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: &'static str,
        spec: Spec,
        missed: Missed,
        grace: Duration,
        type_index: u32,
        priority: u8,
        settings: Settings,
        make: Box<MakePayload>,
    ) -> ScheduleDef {
        ScheduleDef {
            name,
            spec,
            missed,
            grace,
            type_index,
            priority,
            settings,
            make: Some(make),
        }
    }

    /// Slot `slot`'s payload, made by the user's function inside `catch_unwind` (the caller holds
    /// no lock of the store); the panic's message if it panicked.
    pub(crate) fn make(&self, slot: SystemTime) -> Result<Box<dyn Any + Send>, String> {
        let make = self.make.as_ref().expect("kept until dropped");
        unwind::catch(|| make(slot))
            .map_err(|panic| format!("the payload function panicked: {panic}"))
    }
}

impl Drop for ScheduleDef {
    /// The payload function's captures are user values: dropped inside `catch_unwind`.
    fn drop(&mut self) {
        unwind::drop_quietly(self.make.take());
    }
}

impl fmt::Debug for ScheduleDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScheduleDef")
            .field("name", &self.name)
            .field("spec", &self.spec.definition())
            .field("missed", &self.missed)
            .field("grace", &self.grace)
            .field("type_index", &self.type_index)
            .finish_non_exhaustive()
    }
}

/// What one tick of a schedule did, for the scheduler to decide when to look again.
#[derive(Debug)]
pub(crate) struct Tick {
    /// The time the tick read (the database's, on the durable store).
    pub(crate) now: SystemTime,
    /// The schedule's next slot after its watermark (`None`: none left).
    pub(crate) next: Option<SystemTime>,
    /// The schedule is paused: nothing was decided, and the scheduler looks again soon (a
    /// resume in another process sends no signal here).
    pub(crate) paused: bool,
}
