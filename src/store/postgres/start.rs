//! Starting a durable store: connect, check the schema, record the pool's declarations, and
//! start the fetcher and maintenance threads of its roles.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use super::config::Postgres;
use super::migrate::SCHEMA_VERSION;
use super::store::{Lane, Local, PgStore, host_name};
use super::time::manual_base;
use crate::model::clock::Clock;
use crate::model::error::BuildError;
use crate::observe::events::Events;
use crate::observe::stats::Totals;
use crate::store::registry::Registry;
use crate::store::{Store, StoreHub};
use crate::sync::{Arc, Condvar, Mutex, Weak};

impl PgStore {
    /// Connects, checks the schema, and starts the fetcher and maintenance threads.
    pub(crate) fn start(
        registry: Registry,
        settings: Postgres,
        workers: usize,
        clock: Clock,
        events: Events,
    ) -> Result<Arc<PgStore>, BuildError> {
        if let Some(entry) = (0..registry.len())
            .map(|i| registry.entry(i))
            .find(|entry| entry.codec.is_none())
        {
            return Err(BuildError::NotDurable(entry.name));
        }
        let store_error = |e: postgres::Error| BuildError::Store(super::conn::describe(&e));
        let target = super::conn::Target::new(&settings.url, settings.schema.as_deref()).map_err(
            |error| match error {
                crate::SchemaError::InvalidName { problem, .. } => BuildError::InvalidSetting {
                    setting: "schema",
                    of: "the pool",
                    problem,
                },
                crate::SchemaError::Db(e) => store_error(e),
            },
        )?;
        // One connection first, to check the schema: an unreachable database or a wrong
        // name fails the build at once, with the server's message (the pool below retries
        // for its connection timeout).
        let mut client = target.connect().map_err(store_error)?;
        let queue = match super::schema::read(&mut client).map_err(store_error)? {
            Some((version, queue)) if version == SCHEMA_VERSION => queue,
            found => {
                let (migrate, place) = match target.schema() {
                    Some(name) => ("migrate_in", format!("schema {name}")),
                    None => ("migrate", "database".to_owned()),
                };
                return Err(BuildError::Store(format!(
                    "the {place}'s tasq tables are at version {}, this crate needs {}: call \
                     tasq::postgres::{migrate} first",
                    found.map_or(0, |(v, _)| v),
                    SCHEMA_VERSION
                )));
            }
        };
        // The types as this pool declares them, against the fleet's last declarations.
        let holder = format!("{}@{}", std::process::id(), host_name());
        let mismatches =
            super::declarations::record(&mut client, &registry, &holder).map_err(store_error)?;
        let manual_base_us = match clock.manual_offset() {
            Some(offset) => Some(manual_base(&mut client, &clock, offset).map_err(store_error)?),
            None => None,
        };
        drop(client);
        let connections = settings
            .connections
            .unwrap_or_else(|| u32::try_from(workers + 4).unwrap_or(u32::MAX));
        let db = r2d2::Pool::builder()
            .max_size(connections)
            .connection_timeout(Duration::from_secs(10))
            // No round trip to test a connection at each checkout: a broken one fails its
            // statement, which is retried (and r2d2 drops a connection that reports closed).
            .test_on_check_out(false)
            .build(super::conn::Connector::new(target.clone()))
            .map_err(|e| BuildError::Store(e.to_string()))?;
        let prefetch = settings.prefetch;
        // Only the types it has handlers for: a type declared without one is submitted here
        // and run elsewhere.
        let types = registry
            .entries()
            .iter()
            .filter(|entry| entry.runs_here)
            .map(|entry| entry.name.to_owned())
            .collect();
        let gates = super::gates::Gates::new(&registry);
        // A lane per named queue, and the shared one (`api/queues.rs`); one lane of every
        // worker and every queue if no queue is named.
        let lanes: Vec<Lane> = if registry.lanes.is_empty() {
            vec![Lane::new(workers, prefetch)]
        } else {
            let workers = registry.lanes.iter().map(|lane| lane.workers as usize);
            workers
                .map(|workers| Lane::new(workers, prefetch))
                .collect()
        };
        let lane_queues = registry
            .lanes
            .iter()
            .map(|lane| lane.queues.iter().map(|&queue| queue.to_owned()).collect())
            .collect();
        let store = Arc::new(PgStore {
            queue: queue as u64,
            registry,
            db,
            target,
            lease: settings.lease,
            poll_interval: settings.poll_interval,
            manual_base_us,
            types,
            holder,
            lane_queues,
            local: Mutex::new(Local {
                queue: VecDeque::new(),
                running: HashMap::new(),
                // A pool without workers claims nothing, prefetch or not.
                lanes,
                limited: Vec::new(),
                limited_read: None,
                limits_set: 0,
                limited_idle: Vec::new(),
                announced: 0,
                wake: true,
                closed: false,
                stopping: false,
                live_workers: workers,
                handlers_in_shutdown: 0,
                totals: Totals {
                    declaration_mismatches: mismatches.len() as u64,
                    ..Totals::default()
                },
                gate_wake: None,
                litter: Vec::new(),
            }),
            work_cv: Condvar::new(),
            fetch_cv: Condvar::new(),
            done_cv: Condvar::new(),
            waiters: Mutex::new(HashMap::new()),
            acks: super::acks::Acks::default(),
            clock,
            threads: Mutex::new(Vec::new()),
            events,
            gates,
            aging: Mutex::new(super::gates::AgingTurn::default()),
            aging_cv: Condvar::new(),
            hub: StoreHub::new(),
        });
        if let Some(gates) = &store.gates {
            // The rows every process shares: made by the first pool that uses them.
            store
                .with_conn(|c| super::gates::ensure_rows(c, gates))
                .map_err(BuildError::Store)?;
        }
        store.hub.attach(Arc::downgrade(&store) as Weak<PgStore>);
        for event in mismatches {
            store.events.emit(event);
        }
        let sleeper: Weak<PgStore> = Arc::downgrade(&store);
        store.clock.register(sleeper);
        // The fetcher is joined at shutdown. The maintenance thread is not: it outlives the
        // pool while handles of this process still wait (it publishes their outcomes, whichever
        // process ends their tasks), and exits after the last.
        let fetcher =
            super::background::spawn("tasq-pg-fetch", &store, super::dispatch::fetch_loop);
        match fetcher {
            Ok(handle) => store.threads.lock().push(handle),
            Err(error) => {
                store.stop_now();
                return Err(BuildError::Spawn(error));
            }
        }
        // The completer too (`completer.rs`); a pool without workers has no ack to write.
        if workers > 0 {
            match super::background::spawn("tasq-pg-ack", &store, super::completer::complete_loop) {
                Ok(handle) => store.threads.lock().push(handle),
                Err(error) => {
                    store.stop_now();
                    store.join_threads();
                    return Err(BuildError::Spawn(error));
                }
            }
        } else {
            store.acks.stop();
        }
        if let Err(error) =
            super::background::spawn("tasq-pg-maintain", &store, super::background::maintain_loop)
        {
            store.stop_now();
            store.join_threads();
            return Err(BuildError::Spawn(error));
        }
        Ok(store)
    }
}
