//! What an operator's console reads and asks of a queue, on either store: the overview of a
//! whole queue, pages of tasks, one task in full, and the dead letters a bulk action takes.
//! [`Pool`](crate::Pool) answers them for its own store (`overview`, `task_page`,
//! `task_detail`, `retry_dead_letter`); `postgres::Admin` answers them for a durable queue
//! without a pool; the `tasq` command and its dashboard show them.

pub(crate) mod bulk;
pub(crate) mod overview;
pub(crate) mod tasks;
