//! The durable pool's builder (feature `postgres`): [`Builder::postgres`] and the settings of
//! `Builder<Postgres>`.

use std::time::Duration;

use crate::api::builder::{Builder, Embedded, invalid, start};
use crate::api::pool::Pool;
use crate::api::type_options::TypeOptions;
use crate::client::context::Context;
use crate::model::error::BuildError;
use crate::model::retry::HandlerError;
use crate::model::task::TaskType;
use crate::runtime::handlers;
use crate::runtime::monitor::Monitor;
use crate::store::registry::Entry;

impl Builder<Embedded> {
    /// Keeps the pool's tasks in PostgreSQL instead of memory (feature `postgres`): a durable
    /// pool, whose tasks survive the process and are shared by every pool built on the same
    /// database, in any number of processes. `url` is a connection string (`host=... user=...
    /// dbname=...` or `postgresql://...`). Call it before registering task types: a durable
    /// type's payload and output must be serde values (they are stored as JSONB).
    ///
    /// Run [`postgres::migrate`](crate::postgres::migrate) once first.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const EMAIL: TaskType<String, ()> = TaskType::new("email");
    /// let url = "host=127.0.0.1 user=postgres dbname=test";
    /// tasq::postgres::migrate(url)?;
    /// let pool = Pool::builder()
    ///     .postgres(url)
    ///     .workers(4)
    ///     .register(EMAIL, |_, to: &String| Ok::<_, HandlerError>(println!("mail {to}")))
    ///     .build()?;
    /// pool.submit(EMAIL.task("ann@example.com".into()))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn postgres(self, url: impl Into<String>) -> Builder<crate::store::postgres::Postgres> {
        Builder {
            workers: self.workers,
            queues: self.queues,
            max_attempts: self.max_attempts,
            retry: self.retry,
            pending: self.pending,
            schedules: self.schedules,
            duplicate: self.duplicate,
            retention: self.retention,
            retention_set: self.retention_set,
            clock: self.clock,
            seed: self.seed,
            thread_name: self.thread_name,
            stack_size: self.stack_size,
            quiet_panics: self.quiet_panics,
            worker_start: self.worker_start,
            worker_exit: self.worker_exit,
            oversight: self.oversight,
            store: crate::store::postgres::Postgres::new(url.into()),
        }
    }
}

impl Builder<crate::store::postgres::Postgres> {
    /// Registers the handler of durable task type `ty`, with the pool's default options. As
    /// [`Builder::register`], with serde payloads and outputs.
    ///
    /// # Examples
    ///
    /// See [`Builder::postgres`].
    pub fn register<P, O, F>(self, ty: TaskType<P, O>, handler: F) -> Self
    where
        P: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
        O: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
        F: Fn(&Context, &P) -> Result<O, HandlerError> + Send + Sync + 'static,
    {
        self.register_with(ty, TypeOptions::default(), handler)
    }

    /// Registers the handler of durable task type `ty` with its own options. As
    /// [`Builder::register_with`], with serde payloads and outputs.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tasq::{HandlerError, Pool, TaskType, TypeOptions};
    /// const RESIZE: TaskType<(u32, u32), u64> = TaskType::new("resize");
    /// let pool = Pool::builder()
    ///     .postgres("host=127.0.0.1 user=postgres dbname=test")
    ///     .register_with(RESIZE, TypeOptions::new().max_attempts(5), |_, &(w, h): &(u32, u32)| {
    ///         Ok::<_, HandlerError>(u64::from(w) * u64::from(h))
    ///     })
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn register_with<P, O, F>(
        mut self,
        ty: TaskType<P, O>,
        options: TypeOptions,
        handler: F,
    ) -> Self
    where
        P: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
        O: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
        F: Fn(&Context, &P) -> Result<O, HandlerError> + Send + Sync + 'static,
    {
        let mut entry = Entry::new(ty, true);
        entry.codec = Some(crate::model::codec::Codec::of::<P, O>());
        self.push(entry, Some(handlers::erase(handler)), options);
        self
    }

    /// Declares durable task type `ty` with its options, without a handler: this pool may submit
    /// its tasks (a producer, a web process, an ops tool) and never runs them. A task's settings
    /// (attempts, retry policy, timeout) are fixed by the pool that submits it, from the type as
    /// that pool declares or registers it, and every worker process obeys them: declare a type
    /// with the same options its workers register it with (one shared `TypeOptions` constant is
    /// the simplest way), or give a task its own with [`Task::max_attempts`](crate::Task::max_attempts)
    /// and its siblings. [`TaskInfo`](crate::TaskInfo) shows the settings a task got. A pool
    /// built with other options for a type than the last pool built with it on the schema
    /// reports each difference when it is built
    /// ([`crate::Event::DeclarationMismatch`]).
    ///
    /// Declaring a name that is also registered makes [`build`](Builder::build) fail with
    /// [`BuildError::DuplicateType`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tasq::{Pool, TaskType, TypeOptions};
    ///
    /// const EMAIL: TaskType<String, ()> = TaskType::new("email");
    /// // Shared by the producer and the workers: one truth for the type's settings.
    /// const EMAIL_OPTIONS: TypeOptions = TypeOptions::new().max_attempts(8);
    /// let producer = Pool::builder()
    ///     .postgres("host=127.0.0.1 user=postgres dbname=test")
    ///     .workers(0)
    ///     .declare(EMAIL, EMAIL_OPTIONS)
    ///     .build()?;
    /// let handle = producer.submit(EMAIL.task("ann@example.com".into()))?;
    /// assert_eq!(producer.info(handle.id()).unwrap().max_attempts, 8);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn declare<P, O>(mut self, ty: TaskType<P, O>, options: TypeOptions) -> Self
    where
        P: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
        O: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
    {
        let mut entry = Entry::new(ty, false);
        entry.codec = Some(crate::model::codec::Codec::of::<P, O>());
        self.push(entry, None, options);
        self
    }

    /// How long a claim's lease lasts before the reaper may give the task to another worker,
    /// if the worker running it stops extending it (its process died or stalled). A running
    /// task's lease is extended every third of this. Defaults to 30 seconds.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let builder = tasq::Pool::builder()
    ///     .postgres("host=127.0.0.1 user=postgres dbname=test")
    ///     .lease(std::time::Duration::from_secs(10));
    /// # let _ = builder;
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.store.lease = lease;
        self
    }

    /// How often the pool looks for work, cancels and outcomes without being notified: the
    /// fallback for a lost notification or a dropped connection. Defaults to 500 ms.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let builder = tasq::Pool::builder()
    ///     .postgres("host=127.0.0.1 user=postgres dbname=test")
    ///     .poll_interval(std::time::Duration::from_millis(200));
    /// # let _ = builder;
    /// ```
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.store.poll_interval = interval;
        self
    }

    /// How many tasks the pool may claim beyond its free workers, held leased in this process
    /// until a worker takes them, fixed. Claims then go in batches of about this many instead
    /// of one per freed worker: fewer round trips for short tasks, at the price of tasks
    /// waiting here that an idle pool elsewhere could have run (and, once claimed, a cancel
    /// reaches them as it reaches a running task: through the token). `prefetch(0)` claims
    /// only what the workers can start at once. A pool without workers never claims.
    ///
    /// Without it, the pool follows its backlog: while each claim finds more due rows than it
    /// takes, each of its lanes claims ahead as many tasks as its workers finish during two
    /// claims' round trips (from the smoothed times of its last runs and claims; at most 8 per
    /// worker, and at least 32), so its workers never wait for a claim; once a claim finds no
    /// more, it claims only for its free workers again. Long tasks (a run longer than two
    /// round trips per worker) are never claimed ahead.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let builder = tasq::Pool::builder()
    ///     .postgres("host=127.0.0.1 user=postgres dbname=test")
    ///     .workers(1)
    ///     .prefetch(9); // claims ten at a time
    /// # let _ = builder;
    /// ```
    pub fn prefetch(mut self, tasks: usize) -> Self {
        self.store.prefetch = Some(tasks);
        self
    }

    /// The schema that holds the queue: its tables, functions and notification channel (which
    /// derive from it), created by [`postgres::migrate_in`](crate::postgres::migrate_in) with
    /// the same name. Without it, the connection string's `search_path` decides (by default,
    /// `public`). Pools in different schemas of one database are separate queues.
    ///
    /// The name must read the same quoted or not: 1 to 63 bytes of a-z, 0-9 and `_`, not
    /// starting with a digit or `pg_`; `build` fails with [`BuildError::InvalidSetting`]
    /// otherwise.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const BILL: TaskType<u64, ()> = TaskType::new("bill");
    /// let url = "host=127.0.0.1 user=postgres dbname=test";
    /// tasq::postgres::migrate_in(url, "billing")?;
    /// let pool = Pool::builder()
    ///     .postgres(url)
    ///     .schema("billing")
    ///     .register(BILL, |_, _: &u64| Ok::<_, HandlerError>(()))
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn schema(mut self, name: impl Into<String>) -> Self {
        self.store.schema = Some(name.into());
        self
    }

    /// The most database connections the pool opens (besides the one that listens for
    /// notifications). Defaults to the number of workers plus four.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let builder = tasq::Pool::builder()
    ///     .postgres("host=127.0.0.1 user=postgres dbname=test")
    ///     .connections(8);
    /// # let _ = builder;
    /// ```
    pub fn connections(mut self, connections: u32) -> Self {
        self.store.connections = Some(connections);
        self
    }

    /// Checks the configuration, connects, checks the schema and starts the workers.
    ///
    /// # Errors
    ///
    /// As [`Builder::build`], except that zero workers is allowed: a pool that only submits
    /// tasks and waits for them, which pools in other processes run. And
    /// [`BuildError::Store`] if the database cannot be reached or
    /// its schema is not this crate's (run [`postgres::migrate`](crate::postgres::migrate)), or
    /// [`BuildError::NotDurable`] for a type registered before [`Builder::postgres`].
    ///
    /// # Examples
    ///
    /// See [`Builder::postgres`].
    pub fn build(self) -> Result<Pool, BuildError> {
        if self.retention_set {
            // One truth per schema: a process's own setting would delete what the fleet keeps.
            return Err(invalid(
                "retention (and the dead-letter limit)",
                "a durable pool",
                "is the schema's policy, the same for every process: set it with \
                 tasq::postgres::set_policy",
            ));
        }
        let (registry, threads, mut rest) = self.check(true)?;
        let monitor = Monitor::new(
            &mut rest.watch,
            &registry,
            threads.count,
            rest.clock.clone(),
            &threads.name,
        )
        .map_err(BuildError::Spawn)?;
        let timed = registry.entries().iter().any(|e| e.timeout.is_some());
        let store = crate::store::postgres::store::PgStore::start(
            registry,
            rest.store,
            threads.count,
            rest.clock,
            monitor.events.clone(),
        )?;
        start(store, monitor, rest.watch, timed, &threads, rest.schedules)
    }
}
