//! What a durable pool is built with: [`Postgres`], the builder's settings for its store.

use std::time::Duration;

/// The settings of a durable pool: where the database is, and how leases and polling behave.
/// Made by [`Builder::postgres`](crate::Builder::postgres); see the `Builder<Postgres>` methods.
///
/// # Examples
///
/// ```no_run
/// let builder = tasq::Pool::builder()
///     .postgres("host=127.0.0.1 user=postgres dbname=test")
///     .lease(std::time::Duration::from_secs(30));
/// # let _ = builder;
/// ```
#[derive(Clone, Debug)]
pub struct Postgres {
    pub(crate) url: String,
    pub(crate) lease: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) connections: Option<u32>,
    /// Claims held beyond the free workers: `None` follows the lanes' pace (`pace.rs`).
    pub(crate) prefetch: Option<usize>,
    pub(crate) schema: Option<String>,
}

impl Postgres {
    pub(crate) fn new(url: String) -> Self {
        Postgres {
            url,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(500),
            connections: None,
            prefetch: None,
            schema: None,
        }
    }
}
