//! Readying a database: the schema version this crate uses, and the migrations' entry points.

use postgres::NoTls;

/// The version of the durable store's schema that this crate reads and writes:
/// [`migrate`] brings a database to it.
///
/// # Examples
///
/// ```
/// assert!(tasq::postgres::SCHEMA_VERSION >= 1);
/// ```
pub const SCHEMA_VERSION: i32 = super::schema::VERSION;

/// Brings the database's tasq tables to the schema this version of the crate uses, creating
/// them if needed; returns the version it found (0 for none). Safe to call from several
/// processes at once, and again once done. A durable pool refuses to build until it has run.
///
/// # Errors
///
/// The database's error, if it could not connect or a migration failed (nothing of that
/// migration is kept).
///
/// # Examples
///
/// ```no_run
/// let found = tasq::postgres::migrate("host=127.0.0.1 user=postgres dbname=test")?;
/// assert!(found <= tasq::postgres::SCHEMA_VERSION);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn migrate(url: &str) -> Result<i32, postgres::Error> {
    let mut client = postgres::Client::connect(url, NoTls)?;
    super::schema::migrate(&mut client, None)
}

/// As [`migrate`], for the queue in schema `schema` (created if it does not exist): a pool
/// built with [`Builder::schema`](crate::Builder::schema) of that name uses it, whatever the
/// connection string's `search_path`. Everything the queue names derives from the schema: its
/// tables and functions live in it, and its notification channel is `tasq_` and its name.
///
/// # Errors
///
/// [`SchemaError::InvalidName`](crate::SchemaError::InvalidName) for a name tasq does not
/// take (1 to 63 bytes of a-z, 0-9 and `_`, not starting with a digit or `pg_`); the
/// database's error otherwise.
///
/// # Examples
///
/// ```no_run
/// let found = tasq::postgres::migrate_in("host=127.0.0.1 user=postgres dbname=test", "billing")?;
/// assert!(found <= tasq::postgres::SCHEMA_VERSION);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn migrate_in(url: &str, schema: &str) -> Result<i32, crate::SchemaError> {
    let mut client = super::conn::Target::new(url, Some(schema))?.connect()?;
    Ok(super::schema::migrate(&mut client, Some(schema))?)
}
