//! The store's connections: an r2d2 pool of clients, each keeping the statements it has
//! prepared, so that a statement the store runs again costs one round trip, not two (the
//! blocking client prepares a statement given as text before every run of it).

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};

use postgres::types::ToSql;
use postgres::{Client, Config, NoTls, Row, Statement};

/// A connection and the statements prepared on it, by their text.
///
/// The store's statements are fixed texts (a few are built once from constants), so the cache
/// holds a few dozen entries at most. It goes with the connection: a reconnection prepares
/// again. After any error the cache is emptied, so a statement whose plan went stale (a schema
/// change under a running pool) is prepared afresh on the next try.
pub(super) struct Conn {
    client: Client,
    statements: HashMap<String, Statement>,
}

impl Conn {
    /// The prepared statement for `sql`, prepared now if this connection has not yet.
    fn statement(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql)?;
        self.statements.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    /// Runs `f` with `sql` prepared; on an error, forgets every prepared statement.
    fn run<R>(
        &mut self,
        sql: &str,
        f: impl FnOnce(&mut Client, &Statement) -> Result<R, postgres::Error>,
    ) -> Result<R, postgres::Error> {
        let result = self
            .statement(sql)
            .and_then(|statement| f(&mut self.client, &statement));
        if result.is_err() {
            self.statements.clear();
        }
        result
    }

    pub(super) fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, postgres::Error> {
        self.run(sql, |client, statement| client.query(statement, params))
    }

    pub(super) fn query_one(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, postgres::Error> {
        self.run(sql, |client, statement| client.query_one(statement, params))
    }

    pub(super) fn query_opt(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, postgres::Error> {
        self.run(sql, |client, statement| client.query_opt(statement, params))
    }

    pub(super) fn execute(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, postgres::Error> {
        self.run(sql, |client, statement| client.execute(statement, params))
    }
}

/// Transactions and other uses go to the client itself (unprepared).
impl Deref for Conn {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.client
    }
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

/// Opens the pool's connections.
pub(super) struct Connector {
    config: Config,
}

impl Connector {
    pub(super) fn new(config: Config) -> Self {
        Connector { config }
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
        Ok(Conn {
            client: self.config.connect(NoTls)?,
            statements: HashMap::new(),
        })
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), ConnectError> {
        Ok(conn.client.simple_query("").map(drop)?)
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.client.is_closed()
    }
}
