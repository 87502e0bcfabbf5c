//! The operator's handle on one queue: its connection pool, the checks made when it connects,
//! and the bounds every read keeps.

use std::time::Duration;

use crate::model::id::TaskId;
use crate::store::postgres::conn::{self, Conn, Connector, Target};

pub(super) use crate::observe::console::overview::COUNT_CAP;
pub(super) use crate::observe::console::tasks::SCAN;

/// Why the console could not reach or read a queue.
///
/// # Examples
///
/// ```
/// use tasq::postgres::AdminError;
/// let error = AdminError::NotMigrated { schema: "billing".to_owned() };
/// assert_eq!(
///     error.to_string(),
///     "schema billing holds no tasq queue: run `tasq migrate` (or tasq::postgres::migrate) first"
/// );
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The schema name is not one tasq takes.
    #[error(transparent)]
    Setting(#[from] crate::SchemaError),
    /// The database could not be reached, or the connection string does not parse.
    #[error("could not connect to the database: {0}")]
    Connect(String),
    /// The schema holds no tasq tables.
    #[error(
        "schema {schema} holds no tasq queue: run `tasq migrate` (or tasq::postgres::migrate) first"
    )]
    NotMigrated {
        /// The schema looked in (`public`, or the connection's `search_path`, when none was named).
        schema: String,
    },
    /// The tables are at another version than this build of tasq reads.
    #[error(
        "the queue's tables are at version {found}, this build of tasq reads version {expected}: {advice}"
    )]
    Version {
        /// The version found.
        found: i32,
        /// The version this build reads ([`SCHEMA_VERSION`](crate::postgres::SCHEMA_VERSION)).
        expected: i32,
        /// What to do about it: migrate, or use a newer tasq.
        advice: &'static str,
    },
    /// A statement failed (the connection broke, or the server refused it).
    #[error("the database failed: {0}")]
    Db(String),
}

/// An operator's handle on a durable queue: its figures, its tasks a page at a time, one task
/// in full, and the actions of a console (retry or purge dead letters, cancel, pause and
/// resume, queue limits), shared with every pool of the fleet through the rows.
///
/// # Examples
///
/// ```no_run
/// use tasq::console::TaskQuery;
/// use tasq::postgres::Admin;
/// use tasq::TaskState;
///
/// let admin = Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// let overview = admin.overview()?;
/// println!("{} ready, {} dead letters", overview.states.ready, overview.states.dead);
/// let page = admin.tasks(&TaskQuery::new().state(TaskState::Failed).limit(20))?;
/// for task in &page.tasks {
///     println!("{} {} {:?}", task.id, task.task_type, task.last_error);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Admin {
    db: r2d2::Pool<Connector>,
    pub(super) queue: u64,
    schema: Option<String>,
    /// Who pauses and limits, in the rows: `console:<pid>@<host>`.
    pub(super) holder: String,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("queue", &self.queue)
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl Admin {
    /// Connects to the queue in the connection's `search_path` (as
    /// [`Builder::postgres`](crate::Builder::postgres) without a schema does), and checks its
    /// tables.
    ///
    /// # Errors
    ///
    /// [`AdminError::Connect`] when the database cannot be reached (at once, with the server's
    /// or the network's message) or its connection string does not parse,
    /// [`AdminError::NotMigrated`] or [`AdminError::Version`] when the tables are missing or of
    /// another version.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::postgres::{Admin, AdminError};
    /// // Nothing listens on port 1.
    /// let error = Admin::connect("host=127.0.0.1 port=1 user=postgres connect_timeout=2").unwrap_err();
    /// assert!(matches!(error, AdminError::Connect(_)));
    /// ```
    pub fn connect(url: &str) -> Result<Admin, AdminError> {
        Admin::open(url, None)
    }

    /// As [`connect`](Admin::connect), for the queue in schema `schema` (see
    /// [`migrate_in`](crate::postgres::migrate_in)).
    ///
    /// # Errors
    ///
    /// As [`connect`](Admin::connect); a name tasq does not take is
    /// [`AdminError::Setting`].
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::postgres::{Admin, AdminError};
    /// let error = Admin::connect_in("host=127.0.0.1 user=postgres", "Bad-Name").unwrap_err();
    /// assert!(matches!(error, AdminError::Setting(_)));
    /// ```
    pub fn connect_in(url: &str, schema: &str) -> Result<Admin, AdminError> {
        Admin::open(url, Some(schema))
    }

    fn open(url: &str, schema: Option<&str>) -> Result<Admin, AdminError> {
        let target = Target::new(url, schema).map_err(|error| match error {
            crate::SchemaError::Db(e) => {
                AdminError::Connect(format!("the connection string does not parse: {e}"))
            }
            other => AdminError::Setting(other),
        })?;
        // One connection first: an unreachable database fails at once with its reason (the
        // pool below would retry for its whole timeout).
        let mut client = target
            .connect()
            .map_err(|e| AdminError::Connect(conn::describe(&e)))?;
        let db_error = |e: postgres::Error| AdminError::Db(conn::describe(&e));
        let queue = match crate::store::postgres::schema::read(&mut client).map_err(db_error)? {
            Some((version, queue)) if version == crate::store::postgres::schema::VERSION => queue,
            Some((found, _)) => {
                return Err(AdminError::Version {
                    found,
                    expected: crate::store::postgres::schema::VERSION,
                    advice: if found < crate::store::postgres::schema::VERSION {
                        "run `tasq migrate` (or tasq::postgres::migrate)"
                    } else {
                        "use a newer tasq"
                    },
                });
            }
            None => {
                let schema = match schema {
                    Some(name) => name.to_owned(),
                    None => client
                        .query_one("SELECT COALESCE(current_schema(), 'public')", &[])
                        .map_err(db_error)?
                        .get(0),
                };
                return Err(AdminError::NotMigrated { schema });
            }
        };
        drop(client);
        let db = r2d2::Pool::builder()
            .max_size(4)
            .min_idle(Some(0))
            .connection_timeout(Duration::from_secs(5))
            .test_on_check_out(false)
            .build_unchecked(Connector::new(target));
        Ok(Admin {
            db,
            queue: queue as u64,
            schema: schema.map(str::to_owned),
            holder: format!(
                "console:{}@{}",
                std::process::id(),
                crate::store::postgres::store::host_name()
            ),
        })
    }

    /// The queue's id: the first half of every task id in it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// let id = admin.task_id(42);
    /// assert_eq!(id.pool(), admin.queue_id());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn queue_id(&self) -> u64 {
        self.queue
    }

    /// The id of this queue's task number `seq` (the second half of a task id, what the
    /// console shows in short).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// assert_eq!(admin.task_id(7).seq(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn task_id(&self, seq: u64) -> TaskId {
        TaskId::from_parts(self.queue, seq)
    }

    /// The schema named at connection, if any.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let admin = tasq::postgres::Admin::connect_in("host=127.0.0.1 user=postgres dbname=test", "billing")?;
    /// assert_eq!(admin.schema(), Some("billing"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The row number of `id` in this queue, if it is one of its ids.
    pub(super) fn seq(&self, id: TaskId) -> Option<i64> {
        (id.pool() == self.queue)
            .then(|| i64::try_from(id.seq()).ok())
            .flatten()
    }

    pub(super) fn id(&self, seq: i64) -> TaskId {
        TaskId::from_parts(self.queue, seq as u64)
    }

    /// Runs `f` on a connection, as [`Connections::with_conn`](conn::Connections), with
    /// the error as [`AdminError::Db`].
    pub(super) fn run<R>(
        &self,
        f: impl FnMut(&mut Conn) -> Result<R, postgres::Error>,
    ) -> Result<R, AdminError> {
        conn::Connections::with_conn(self, f).map_err(AdminError::Db)
    }
}

impl conn::Connections for Admin {
    /// A statement on a pooled connection; run again once if the connection was found broken
    /// before anything could have committed (a server restart, an idle connection closed).
    fn with_conn<R>(
        &self,
        mut f: impl FnMut(&mut Conn) -> Result<R, postgres::Error>,
    ) -> Result<R, String> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let mut conn = self.db.get().map_err(|e| e.to_string())?;
            conn.start();
            let result = conn.check_if_idle(attempts > 1).and_then(|()| f(&mut conn));
            match result {
                Ok(value) => return Ok(value),
                Err(error) if attempts < 3 && conn.lost_before_commit(&error) => continue,
                Err(error) => return Err(conn::describe(&error)),
            }
        }
    }
}
