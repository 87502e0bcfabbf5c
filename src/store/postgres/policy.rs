//! The queue's policy: how long finished rows stay and how many dead letters are kept. One
//! value per schema, stored with it (in `tasq_schema`), changed on purpose with
//! [`set_policy`], and obeyed by every process: no pool's own settings delete what the fleet
//! keeps.

use std::time::Duration;

use postgres::NoTls;

use super::rows;

/// What the durable queue keeps, for every process that shares its schema: finished tasks (for
/// `status`, `info`, the keys of succeeded tasks, bringing back dependents) until they are
/// older than [`finished_max_age`](Policy::finished_max_age) or past the newest
/// [`finished_max_count`](Policy::finished_max_count), and up to
/// [`dead_letter_limit`](Policy::dead_letter_limit) dead letters (the oldest stop being dead
/// letters first). Read it with [`policy`], change it with [`set_policy`]; a durable pool never
/// takes these from its builder (a builder given [`Builder::retention`](crate::Builder::retention)
/// or [`Builder::dead_letter_limit`](crate::Builder::dead_letter_limit) refuses to build a
/// durable pool).
///
/// Defaults (what [`migrate`](super::migrate::migrate) stores): finished tasks kept 24 hours whatever
/// their number, 10,000 dead letters.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// let policy = tasq::postgres::Policy::default()
///     .finished_max_age(Some(Duration::from_secs(7 * 24 * 3600)))
///     .dead_letter_limit(None);
/// assert_eq!(policy.finished_max_count_value(), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    finished_max_age: Option<Duration>,
    finished_max_count: Option<u64>,
    dead_letter_limit: Option<u64>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            finished_max_age: Some(Duration::from_secs(24 * 3600)),
            finished_max_count: None,
            dead_letter_limit: Some(10_000),
        }
    }
}

impl Policy {
    /// Finished tasks (not dead letters) are deleted once they finished this long ago; `None`
    /// keeps them whatever their age. Defaults to 24 hours.
    ///
    /// # Examples
    ///
    /// ```
    /// let keep_all = tasq::postgres::Policy::default().finished_max_age(None);
    /// assert_eq!(keep_all.finished_max_age_value(), None);
    /// ```
    pub fn finished_max_age(mut self, age: Option<Duration>) -> Self {
        self.finished_max_age = age;
        self
    }

    /// At most this many finished tasks (not dead letters) are kept, the newest; `None` keeps
    /// any number. Defaults to `None`.
    ///
    /// # Examples
    ///
    /// ```
    /// let policy = tasq::postgres::Policy::default().finished_max_count(Some(1_000_000));
    /// assert_eq!(policy.finished_max_count_value(), Some(1_000_000));
    /// ```
    pub fn finished_max_count(mut self, count: Option<u64>) -> Self {
        self.finished_max_count = count;
        self
    }

    /// At most this many dead letters are kept, the newest; `None` keeps any number. Defaults
    /// to 10,000.
    ///
    /// # Examples
    ///
    /// ```
    /// let policy = tasq::postgres::Policy::default().dead_letter_limit(Some(100));
    /// assert_eq!(policy.dead_letter_limit_value(), Some(100));
    /// ```
    pub fn dead_letter_limit(mut self, limit: Option<u64>) -> Self {
        self.dead_letter_limit = limit;
        self
    }

    /// See [`finished_max_age`](Policy::finished_max_age).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let day = Some(Duration::from_secs(24 * 3600));
    /// assert_eq!(tasq::postgres::Policy::default().finished_max_age_value(), day);
    /// ```
    pub fn finished_max_age_value(&self) -> Option<Duration> {
        self.finished_max_age
    }

    /// See [`finished_max_count`](Policy::finished_max_count).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tasq::postgres::Policy::default().finished_max_count_value(), None);
    /// ```
    pub fn finished_max_count_value(&self) -> Option<u64> {
        self.finished_max_count
    }

    /// See [`dead_letter_limit`](Policy::dead_letter_limit).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tasq::postgres::Policy::default().dead_letter_limit_value(), Some(10_000));
    /// ```
    pub fn dead_letter_limit_value(&self) -> Option<u64> {
        self.dead_letter_limit
    }
}

/// The policy of the schema that `url` names (see [`Policy`]).
///
/// # Errors
///
/// The database's error: it could not be reached, or its schema was never migrated.
///
/// # Examples
///
/// ```no_run
/// let policy = tasq::postgres::policy("host=127.0.0.1 user=postgres dbname=test")?;
/// println!("dead letters kept: {:?}", policy.dead_letter_limit_value());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn policy(url: &str) -> Result<Policy, postgres::Error> {
    let mut client = postgres::Client::connect(url, NoTls)?;
    read(&mut client)
}

/// The policy of the queue in schema `schema` of the database `url` names (see [`Policy`]).
///
/// # Errors
///
/// [`SchemaError::InvalidName`](crate::SchemaError::InvalidName) for a name tasq does not
/// take; the database's error otherwise: it could not be reached, or the schema was never
/// migrated.
///
/// # Examples
///
/// ```no_run
/// let policy = tasq::postgres::policy_in("host=127.0.0.1 user=postgres dbname=test", "billing")?;
/// println!("finished tasks kept for {:?}", policy.finished_max_age_value());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn policy_in(url: &str, schema: &str) -> Result<Policy, crate::SchemaError> {
    let mut client = super::conn::Target::new(url, Some(schema))?.connect()?;
    Ok(read(&mut client)?)
}

fn read(client: &mut postgres::Client) -> Result<Policy, postgres::Error> {
    Ok(of_row(&client.query_one(READ, &[])?))
}

/// Sets the policy of the schema that `url` names, for every process that shares it: their
/// cleaner applies it from its next pass (within about a second).
///
/// # Errors
///
/// The database's error: it could not be reached, or its schema was never migrated.
///
/// # Examples
///
/// ```no_run
/// use tasq::postgres::{Policy, set_policy};
/// // Keep every finished task (the keys of succeeded ones deduplicate for ever).
/// set_policy("host=127.0.0.1 user=postgres dbname=test", &Policy::default().finished_max_age(None))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn set_policy(url: &str, policy: &Policy) -> Result<(), postgres::Error> {
    let mut client = postgres::Client::connect(url, NoTls)?;
    write(&mut client, policy)
}

/// Sets the policy of the queue in schema `schema` of the database `url` names, as
/// [`set_policy`] does.
///
/// # Errors
///
/// As [`policy_in`].
///
/// # Examples
///
/// ```no_run
/// use tasq::postgres::{Policy, set_policy_in};
/// let url = "host=127.0.0.1 user=postgres dbname=test";
/// set_policy_in(url, "billing", &Policy::default().dead_letter_limit(Some(100_000)))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn set_policy_in(url: &str, schema: &str, policy: &Policy) -> Result<(), crate::SchemaError> {
    let mut client = super::conn::Target::new(url, Some(schema))?.connect()?;
    Ok(write(&mut client, policy)?)
}

fn write(client: &mut postgres::Client, policy: &Policy) -> Result<(), postgres::Error> {
    let count = |n: Option<u64>| n.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
    client.execute(
        "UPDATE tasq_schema SET finished_max_age_us = $1, finished_max_count = $2,
                dead_letter_limit = $3",
        &[
            &policy.finished_max_age.map(rows::micros),
            &count(policy.finished_max_count),
            &count(policy.dead_letter_limit),
        ],
    )?;
    Ok(())
}

/// Reads the policy as the schema holds it now (see [`of_row`]).
pub(crate) const READ: &str =
    "SELECT finished_max_age_us, finished_max_count, dead_letter_limit FROM tasq_schema";

/// The policy in a row that [`READ`] returned.
pub(crate) fn of_row(row: &postgres::Row) -> Policy {
    let count = |n: Option<i64>| n.map(|n| u64::try_from(n).unwrap_or(0));
    Policy {
        finished_max_age: row
            .get::<_, Option<i64>>(0)
            .map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))),
        finished_max_count: count(row.get(1)),
        dead_letter_limit: count(row.get(2)),
    }
}
