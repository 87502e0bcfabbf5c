//! What runs a pool above its store: the worker threads (claim, run the handler outside any
//! lock and inside `catch_unwind`, complete), the handlers they run, the monitor (timeouts,
//! stuck runs, alerts, the metrics' clock), and the scheduler (the periodic tasks' ticks).
//!
//! May import everything below it (`model/`, `gates/`, `observe/`, `store/` through its seam,
//! `client/` for the handler's context); never the public face (`api/`).

pub(crate) mod handlers;
pub(crate) mod monitor;
pub(crate) mod scheduler;
pub(crate) mod worker;
