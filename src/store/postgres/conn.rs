//! The store's connections: an r2d2 pool of clients, each keeping the statements it has
//! prepared, so that a statement the store runs again, in a transaction or not, costs one round
//! trip, not two (the blocking client prepares a statement given as text before every run of
//! it). The store's SQL goes through [`Sql`], so one function serves the store's connections
//! and a caller's own transaction.

use std::collections::HashMap;

use postgres::types::ToSql;
use postgres::{Client, Config, GenericClient, NoTls, Row, Statement, Transaction};

/// A connection and the statements prepared on it, by their text.
///
/// The store's statements are fixed texts (a few are built once from constants), so the cache
/// holds a few dozen entries at most. It goes with the connection: a reconnection prepares
/// again. After any error the cache is emptied, so a statement whose plan went stale (a schema
/// change under a running pool) is prepared afresh on the next try.
pub(super) struct Conn {
    client: Client,
    statements: Statements,
    /// When the pool last handed it out: a connection idle longer than [`IDLE_CHECK`] is
    /// checked with a round trip before use (see [`Conn::check_if_idle`]).
    last_used: std::time::Instant,
    /// Whether, since [`Conn::start`], anything that may commit was sent: a statement outside
    /// a transaction (any use of [`Sql::client`] on the connection itself) or a `COMMIT`. Until
    /// then a lost connection lost nothing, and the work can run again on another one.
    may_have_committed: bool,
}

/// A pooled connection idle this long is checked before use: its server process may have been
/// terminated meanwhile (an outage, a restart, `pg_terminate_backend`), and a statement sent on
/// it would fail at once. Connections in steady use skip the check (it costs a round trip).
const IDLE_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Where the store's statements run: a pooled connection or a transaction on one (both keep
/// the connection's prepared statements), or a caller's own transaction (prepared at each run).
/// The statements are given as text; the four methods run them as the client's methods do.
pub(super) trait Sql {
    type Client: GenericClient;

    /// The client to run on.
    fn client(&mut self) -> &mut Self::Client;

    /// `sql` prepared: kept from an earlier run where this side keeps statements.
    fn statement(&mut self, sql: &str) -> Result<Statement, postgres::Error>;

    /// Forgets the kept statements (after an error: a plan may have gone stale).
    fn forget(&mut self) {}

    /// Runs `f` with `sql` prepared; on an error, forgets the kept statements.
    fn run<R>(
        &mut self,
        sql: &str,
        f: impl FnOnce(&mut Self::Client, &Statement) -> Result<R, postgres::Error>,
    ) -> Result<R, postgres::Error> {
        let result = self
            .statement(sql)
            .and_then(|statement| f(self.client(), &statement));
        if result.is_err() {
            self.forget();
        }
        result
    }

    fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, postgres::Error> {
        self.run(sql, |client, statement| client.query(statement, params))
    }

    fn query_one(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, postgres::Error> {
        self.run(sql, |client, statement| client.query_one(statement, params))
    }

    fn query_opt(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, postgres::Error> {
        self.run(sql, |client, statement| client.query_opt(statement, params))
    }

    fn execute(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, postgres::Error> {
        self.run(sql, |client, statement| client.execute(statement, params))
    }
}

/// The statements prepared on one connection, by their text.
#[derive(Default)]
struct Statements(HashMap<String, Statement>);

impl Statements {
    fn get(
        &mut self,
        client: &mut impl GenericClient,
        sql: &str,
    ) -> Result<Statement, postgres::Error> {
        if let Some(statement) = self.0.get(sql) {
            return Ok(statement.clone());
        }
        let statement = client.prepare(sql)?;
        self.0.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }
}

impl Sql for Conn {
    type Client = Client;

    fn client(&mut self) -> &mut Client {
        // Whatever runs on the bare client commits as it runs.
        self.may_have_committed = true;
        &mut self.client
    }

    fn statement(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        self.statements.get(&mut self.client, sql)
    }

    fn forget(&mut self) {
        self.statements.0.clear();
    }
}

impl Conn {
    /// Whether the connection answers, checked with an empty query if it was idle longer than
    /// [`IDLE_CHECK`] (or whatever its idleness, with `always`); marks it used now.
    pub(super) fn check_if_idle(&mut self, always: bool) -> Result<(), postgres::Error> {
        let now = std::time::Instant::now();
        let idle = now.duration_since(self.last_used) >= IDLE_CHECK;
        self.last_used = now;
        if idle || always {
            self.client.simple_query("")?;
        }
        Ok(())
    }

    /// Marks the start of a piece of work on the connection: nothing of it has been sent yet
    /// (see [`Conn::lost_before_commit`]).
    pub(super) fn start(&mut self) {
        self.may_have_committed = false;
    }

    /// Whether `error` says the connection was lost (closed, or its socket failed) before
    /// anything of the work since [`Conn::start`] could have committed: then the work did
    /// nothing, and is safe to run again on another connection. A connection whose server
    /// process was terminated while it sat idle in the pool fails this way on its first
    /// statement.
    pub(super) fn lost_before_commit(&self, error: &postgres::Error) -> bool {
        is_lost(error) && !self.may_have_committed
    }

    /// Runs `sql`, which only reads, on the bare connection, as [`Sql::query`] does; unlike
    /// it, keeps the work safe to run again if the connection is lost (a read commits
    /// nothing).
    pub(super) fn query_read(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, postgres::Error> {
        let result = self
            .statements
            .get(&mut self.client, sql)
            .and_then(|statement| self.client.query(&statement, params));
        if result.is_err() {
            self.forget();
        }
        result
    }

    /// A transaction whose statements use (and add to) the connection's prepared ones.
    pub(super) fn transaction(&mut self) -> Result<Tx<'_>, postgres::Error> {
        Ok(Tx {
            tx: self.client.transaction()?,
            statements: &mut self.statements,
            may_have_committed: &mut self.may_have_committed,
        })
    }
}

/// A transaction on a pooled connection (see [`Conn::transaction`]).
pub(super) struct Tx<'a> {
    tx: Transaction<'a>,
    statements: &'a mut Statements,
    may_have_committed: &'a mut bool,
}

impl Tx<'_> {
    pub(super) fn commit(self) -> Result<(), postgres::Error> {
        // From here a lost connection leaves the outcome unknown.
        *self.may_have_committed = true;
        self.tx.commit()
    }
}

impl<'a> Sql for Tx<'a> {
    type Client = Transaction<'a>;

    fn client(&mut self) -> &mut Transaction<'a> {
        &mut self.tx
    }

    fn statement(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        self.statements.get(&mut self.tx, sql)
    }

    fn forget(&mut self) {
        self.statements.0.clear();
    }
}

/// A caller's own transaction (`submit_in`, `succeed_in`): its connection is not the store's,
/// so each statement is prepared where it runs.
impl<'a> Sql for Transaction<'a> {
    type Client = Transaction<'a>;

    fn client(&mut self) -> &mut Transaction<'a> {
        self
    }

    fn statement(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        self.prepare(sql)
    }
}

/// Whether `error` says the connection was lost: closed, or its socket failed.
pub(super) fn is_lost(error: &postgres::Error) -> bool {
    error.is_closed()
        || std::error::Error::source(error).is_some_and(|cause| cause.is::<std::io::Error>())
}

/// A database error's text with its causes: the client's own `Display` says only what kind of
/// error it is ("db error"), and the server's message is its source.
pub(super) fn describe(error: &postgres::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Sets the TCP settings of every connection the store makes: keepalives and a user timeout,
/// so the kernel ends a connection whose peer stopped acknowledging (a half-open connection: the
/// server's machine vanished, a network path dropped) within about ten seconds instead of
/// leaving a statement or the listener waiting on it for ever. Settings the connection string
/// gives are kept.
fn tcp_settings(config: &mut Config) {
    if config.get_keepalives_idle() == std::time::Duration::from_secs(2 * 60 * 60) {
        config
            .keepalives(true)
            .keepalives_idle(std::time::Duration::from_secs(5))
            .keepalives_interval(std::time::Duration::from_secs(1))
            .keepalives_retries(3);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(std::time::Duration::from_secs(10));
    }
}

/// What the store sets on each of its connections as it opens it.
///
/// No JIT compilation: the store's statements are short and read a few index ranges, but the
/// planner's estimates for the skip scans behind the figures (see `stats.rs`) and the aging
/// update run past `jit_above_cost`, and compiling them took 200 ms for a statement that runs
/// in 2 (on 1,000,000 rows). A caller's own transactions (`submit_in`) keep their setting.
pub(super) const SESSION: &str = "SET jit = off";

/// Where the store's connections go: the server the connection string names (with
/// [`tcp_settings`]), and the schema that holds the queue, if the pool names one (else the
/// connection string's `search_path` decides). Every connection the store makes goes through
/// [`Target::connect`].
#[derive(Clone)]
pub(super) struct Target {
    config: Config,
    schema: Option<String>,
}

impl Target {
    /// The target of `url`, in `schema` if given: an error if the connection string does not
    /// parse or the schema's name is not one tasq accepts (see `schema::check_name`).
    pub(super) fn new(url: &str, schema: Option<&str>) -> Result<Target, crate::SchemaError> {
        if let Some(name) = schema {
            super::schema::check_name(name).map_err(|problem| crate::SchemaError::InvalidName {
                name: name.to_owned(),
                problem,
            })?;
        }
        let mut config: Config = url.parse()?;
        tcp_settings(&mut config);
        Ok(Target {
            config,
            schema: schema.map(str::to_owned),
        })
    }

    /// The schema the pool names, if any.
    pub(super) fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// A new connection, with the store's session settings ([`SESSION`]) and its schema first
    /// on the `search_path` (which may not exist yet: `migrate_in` creates it).
    pub(super) fn connect(&self) -> Result<Client, postgres::Error> {
        let mut client = self.config.connect(NoTls)?;
        match &self.schema {
            // Checked by `check_name`: nothing to quote.
            Some(name) => client.batch_execute(&format!("{SESSION}; SET search_path TO {name}"))?,
            None => client.batch_execute(SESSION)?,
        }
        Ok(client)
    }
}

/// Opens the pool's connections.
pub(super) struct Connector {
    target: Target,
}

impl Connector {
    pub(super) fn new(target: Target) -> Self {
        Connector { target }
    }
}

/// A connection's failure as r2d2 reports it, with the server's message (r2d2 keeps only the
/// text of the last error).
#[derive(Debug)]
pub(super) struct ConnectError(String);

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConnectError {}

impl From<postgres::Error> for ConnectError {
    fn from(error: postgres::Error) -> Self {
        ConnectError(describe(&error))
    }
}

impl r2d2::ManageConnection for Connector {
    type Connection = Conn;
    type Error = ConnectError;

    fn connect(&self) -> Result<Conn, ConnectError> {
        let client = self.target.connect()?;
        Ok(Conn {
            client,
            statements: Statements::default(),
            last_used: std::time::Instant::now(),
            may_have_committed: false,
        })
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), ConnectError> {
        Ok(conn.client.simple_query("").map(drop)?)
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.client.is_closed()
    }
}

/// What a role that needs only connections takes, rather than the whole store (the store
/// implements it): a statement run on a pooled connection, retried through an outage as the
/// store retries its own.
pub(super) trait Connections {
    fn with_conn<R>(
        &self,
        f: impl FnMut(&mut Conn) -> Result<R, postgres::Error>,
    ) -> Result<R, String>;
}
