//! What a pool tells the people who run it: events and their delivery to hooks, `tracing`,
//! run metrics (and their Prometheus text), backlog alerts, the stats snapshots, and what an
//! operator's console reads (`console/`).
//!
//! The stores emit events and count runs, so this layer sits below them: it may import
//! `model/` and `gates/` (a breaker's state is reported), never the stores or anything above.

pub(crate) mod alert;
pub(crate) mod console;
pub(crate) mod event;
pub(crate) mod events;
pub(crate) mod metrics;
pub(crate) mod stats;
pub(crate) mod trace;
