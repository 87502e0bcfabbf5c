//! User code never breaks a durable pool: every place the durable store runs a user type's code
//! (a payload's `Serialize` at submit and `Deserialize` at claim, an output's `Serialize` when
//! its task succeeds and `Deserialize` when another pool reads it from the row, and the `Drop`
//! of payloads and outputs, also of claims given back at shutdown) meets a type that panics
//! there, and one that calls back into the pool there. The pool keeps its workers, the task
//! ends in the state the store documents, and every wait returns.
#![cfg(feature = "postgres")]

mod support_pg;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use support_pg::TestDb;
use tasq::{FailureReason, HandlerError, Outcome, Pool, TaskType};

/// Every panic these tests cause on purpose says this; the panic hook keeps those quiet.
const EXPECTED: &str = "[hostile: expected panic]";
const STEP: Duration = Duration::from_secs(10);

/// What a [`Hostile`] value does, and where.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Traits {
    panic_on_serialize: bool,
    panic_on_deserialize: bool,
    panic_on_drop: bool,
    /// Calls back into the pool of this slot (see [`SLOTS`]) when dropped.
    reenter_on_drop: Option<u32>,
}

/// A payload and an output whose serde impls and `Drop` do what its traits say. A value made
/// by `Deserialize` carries the same traits (they travel in the JSON).
#[derive(Clone, Debug, PartialEq)]
struct Hostile {
    n: u32,
    traits: Traits,
}

impl Hostile {
    fn plain(n: u32) -> Self {
        Hostile {
            n,
            traits: Traits::default(),
        }
    }

    fn with(n: u32, traits: Traits) -> Self {
        Hostile { n, traits }
    }
}

#[derive(Serialize, Deserialize)]
struct Wire {
    n: u32,
    traits: Traits,
}

impl Serialize for Hostile {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.traits.panic_on_serialize {
            panic!("{EXPECTED} Serialize");
        }
        Wire {
            n: self.n,
            traits: self.traits,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Hostile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(deserializer)?;
        if wire.traits.panic_on_deserialize {
            panic!("{EXPECTED} Deserialize");
        }
        Ok(Hostile {
            n: wire.n,
            traits: wire.traits,
        })
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        if let Some(slot) = self.traits.reenter_on_drop {
            reenter(slot, self.n);
        }
        if self.traits.panic_on_drop {
            panic!("{EXPECTED} Drop");
        }
    }
}

const ECHO: TaskType<Hostile, Hostile> = TaskType::new("echo");
/// The handler returns the output its payload describes: `n + 1` with the traits of
/// `OUTPUT_TRAITS[n]`.
const MAKE: TaskType<u32, Hostile> = TaskType::new("make");
const PLAIN: TaskType<u32, u32> = TaskType::new("plain");

/// The pools that hostile values call back into, by slot, and what each callback saw.
static SLOTS: Mutex<Option<HashMap<u32, Slot>>> = Mutex::new(None);

struct Slot {
    pool: Arc<Pool>,
    seen: crossbeam_channel::Sender<Reentered>,
}

/// What one call back into the pool saw.
#[derive(Debug)]
struct Reentered {
    from: u32,
    workers: usize,
    /// The outcome of a task submitted from the `Drop` and waited for there.
    waited: Option<Outcome<u32>>,
}

fn register_slot(slot: u32, pool: Arc<Pool>) -> crossbeam_channel::Receiver<Reentered> {
    let (seen, receiver) = crossbeam_channel::unbounded();
    SLOTS
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .insert(slot, Slot { pool, seen });
    receiver
}

fn forget_slot(slot: u32) {
    SLOTS
        .lock()
        .unwrap()
        .as_mut()
        .map(|slots| slots.remove(&slot));
}

/// A `Drop` calling back: the pool's stats, and a task submitted and waited for (the pool
/// runs it on another worker).
fn reenter(slot: u32, from: u32) {
    let found = SLOTS
        .lock()
        .unwrap()
        .as_ref()
        .and_then(|slots| slots.get(&slot))
        .map(|s| (Arc::clone(&s.pool), s.seen.clone()));
    let Some((pool, seen)) = found else { return };
    let workers = pool.stats().workers;
    let waited = pool
        .submit(PLAIN.task(from))
        .ok()
        .and_then(|handle| handle.wait_timeout(STEP));
    let _ = seen.send(Reentered {
        from,
        workers,
        waited,
    });
}

/// The next `count` callbacks, which must all come from values numbered `from`.
#[track_caller]
fn callbacks(
    seen: &crossbeam_channel::Receiver<Reentered>,
    from: u32,
    count: usize,
) -> Vec<Reentered> {
    let callbacks: Vec<Reentered> = (0..count)
        .map(|i| {
            seen.recv_timeout(STEP)
                .unwrap_or_else(|_| panic!("callback {i} of {count} from {from} never came"))
        })
        .collect();
    assert!(callbacks.iter().all(|c| c.from == from), "{callbacks:?}");
    callbacks
}

fn silence_expected_panics() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or("");
            if !message.starts_with(EXPECTED) {
                default(info);
            }
        }));
    });
}

/// A durable pool of `workers` that echoes hostile payloads, makes hostile outputs by the
/// table `outputs` (index: the payload), and runs plain tasks.
fn pool(db: &TestDb, workers: usize, prefetch: usize, outputs: Vec<Traits>) -> Arc<Pool> {
    silence_expected_panics();
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(workers)
        .prefetch(prefetch)
        .register(ECHO, |_, payload: &Hostile| {
            Ok::<_, HandlerError>(Hostile::plain(payload.n))
        })
        .register(MAKE, move |_, &n: &u32| {
            let traits = outputs.get(n as usize).copied().unwrap_or_default();
            Ok::<_, HandlerError>(Hostile::with(n + 1, traits))
        })
        .register(PLAIN, |_, &n: &u32| Ok::<_, HandlerError>(n))
        .build()
        .unwrap();
    Arc::new(pool)
}

/// The pool still runs tasks on all its workers, and no worker died.
#[track_caller]
fn assert_healthy(pool: &Pool, workers: usize) {
    let stats = pool.stats();
    assert_eq!(stats.workers, workers, "a worker died");
    assert_eq!(stats.totals.worker_panics, 0);
    let handle = pool.submit(PLAIN.task(99)).unwrap();
    assert_eq!(handle.wait_timeout(STEP), Some(Outcome::Succeeded(99)));
}

fn failed_with(outcome: Option<Outcome<Hostile>>, reason: FailureReason, text: &str) {
    match outcome {
        Some(Outcome::Failed(failure)) => {
            assert_eq!(failure.reason, reason, "{failure:?}");
            assert!(failure.error.contains(text), "{:?}", failure.error);
        }
        other => panic!("expected a failure ({text}), got {other:?}"),
    }
}

/// A payload whose `Serialize` panics is refused at submit with a typed error; one whose
/// `Deserialize` panics becomes a dead letter when a worker claims it; an output whose
/// `Serialize` panics fails its task; an output whose `Deserialize` panics reaches a handle of
/// another pool as a failure. No worker dies, and every wait returns.
#[test]
fn panicking_serde_impls_become_typed_errors_and_dead_letters() {
    let Some(db) = TestDb::new() else { return };
    let outputs = vec![
        Traits::default(),
        Traits {
            panic_on_serialize: true,
            ..Traits::default()
        },
        Traits {
            panic_on_deserialize: true,
            ..Traits::default()
        },
    ];
    let pool = pool(&db, 2, 0, outputs);

    let refused = pool.submit(ECHO.task(Hostile::with(
        1,
        Traits {
            panic_on_serialize: true,
            ..Traits::default()
        },
    )));
    match refused {
        Err(error) => assert!(
            matches!(error.kind(), tasq::SubmitErrorKind::Unserializable(m) if m.contains("panicked")),
            "{error:?}"
        ),
        Ok(handle) => panic!("a payload that cannot serialize was accepted: {handle:?}"),
    }

    let undecodable = pool
        .submit(ECHO.task(Hostile::with(
            2,
            Traits {
                panic_on_deserialize: true,
                ..Traits::default()
            },
        )))
        .unwrap();
    failed_with(
        undecodable.wait_timeout(STEP),
        FailureReason::BadPayload,
        "Deserialize panicked",
    );
    assert_eq!(pool.dead_letters()[0].id, undecodable.id());

    let unencodable = pool.submit(MAKE.task(1)).unwrap();
    failed_with(
        unencodable.wait_timeout(STEP),
        FailureReason::BadPayload,
        "the output could not be encoded",
    );

    // The output's `Deserialize` runs where the row is read: here, a second pool's handle.
    let reader = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .register(MAKE, |_, &n: &u32| Ok::<_, HandlerError>(Hostile::plain(n)))
        .build()
        .unwrap();
    let decoded_elsewhere = pool.submit(MAKE.task(2)).unwrap();
    let output = decoded_elsewhere.wait_timeout(STEP);
    assert!(
        matches!(&output, Some(Outcome::Succeeded(h)) if h.n == 3),
        "the running pool's own handle gets the output itself: {output:?}"
    );
    let elsewhere = reader.handle(MAKE, decoded_elsewhere.id()).unwrap();
    failed_with(
        elsewhere.wait_timeout(STEP),
        FailureReason::BadPayload,
        "its output could not be decoded",
    );
    drop(output);

    assert_healthy(&pool, 2);
    reader.shutdown(STEP);
    pool.shutdown(STEP);
}

/// Payloads and outputs whose `Drop` panics, or calls back into the pool (stats, a submit and
/// a wait for it), on every path that drops them: a payload after its run, an output nobody
/// waits for, and claims a prefetching pool gives back at shutdown. Each task ends as it
/// should, each callback sees the pool working, and no worker dies.
#[test]
fn payloads_and_outputs_whose_drop_panics_or_calls_back() {
    const SLOT: u32 = 1;
    let Some(db) = TestDb::new() else { return };
    let panics = Traits {
        panic_on_drop: true,
        ..Traits::default()
    };
    let reenters = Traits {
        reenter_on_drop: Some(SLOT),
        ..Traits::default()
    };
    // MAKE's outputs: 0 panics when dropped, 1 calls back.
    let pool = pool(&db, 2, 0, vec![panics, reenters]);
    let seen = register_slot(SLOT, Arc::clone(&pool));

    // Payloads, dropped by a worker once the run is written (the completer, which writes
    // the successes, leaves them to the workers: a drop that waits would stall it).
    let panicking = pool.submit(ECHO.task(Hostile::with(10, panics))).unwrap();
    assert_eq!(
        panicking.wait_timeout(STEP),
        Some(Outcome::Succeeded(Hostile::plain(10)))
    );
    let reentering = pool.submit(ECHO.task(Hostile::with(11, reenters))).unwrap();
    assert_eq!(
        reentering.wait_timeout(STEP),
        Some(Outcome::Succeeded(Hostile::plain(11)))
    );
    // Two drops call back: the submitted value's, at submit, and the worker's decoded copy's,
    // after the run.
    for callback in callbacks(&seen, 11, 2) {
        assert_eq!(callback.workers, 2);
        assert_eq!(callback.waited, Some(Outcome::Succeeded(11)));
    }

    // Outputs nobody waits for: the store drops them after writing the success.
    drop(pool.submit(MAKE.task(0)).unwrap());
    drop(pool.submit(MAKE.task(1)).unwrap());
    let callback = callbacks(&seen, 2, 1).remove(0);
    assert_eq!(callback.waited, Some(Outcome::Succeeded(2)), "output 1 + 1");
    // Both succeeded, whatever their outputs did when dropped.
    let succeeded: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM tasq_tasks WHERE type = 'make' AND status = 'succeeded'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(succeeded, 2);

    assert_healthy(&pool, 2);
    forget_slot(SLOT);
    pool.shutdown(STEP);
}

/// A prefetching pool's held claims are given back at shutdown and their payloads dropped
/// there: one panics, one calls back into another pool (which runs what it submits). Shutdown
/// returns, the rows go back to the queue, and a later pool runs them.
#[test]
fn held_claims_given_back_at_shutdown_drop_hostile_payloads_quietly() {
    const SLOT: u32 = 2;
    const GATE: TaskType<u32, u32> = TaskType::new("gate");
    /// Only the prefetching pools run this type.
    const HELD: TaskType<Hostile, u32> = TaskType::new("held");
    let Some(db) = TestDb::new() else { return };
    // The pool that a given-back payload's `Drop` calls back into.
    let helper = pool(&db, 1, 0, Vec::new());
    let seen = register_slot(SLOT, Arc::clone(&helper));
    let started = Arc::new(std::sync::Barrier::new(2));
    let release = Arc::new(std::sync::Barrier::new(2));
    let (s, r) = (Arc::clone(&started), Arc::clone(&release));
    let held = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .prefetch(4)
        .register(GATE, move |_, &n: &u32| {
            s.wait();
            r.wait();
            Ok::<_, HandlerError>(n)
        })
        .register(HELD, |_, payload: &Hostile| {
            Ok::<_, HandlerError>(payload.n)
        })
        .build()
        .unwrap();
    let gate = held.submit(GATE.task(0)).unwrap();
    started.wait();
    let payloads = [
        Hostile::with(
            20,
            Traits {
                panic_on_drop: true,
                ..Traits::default()
            },
        ),
        Hostile::with(
            21,
            Traits {
                reenter_on_drop: Some(SLOT),
                ..Traits::default()
            },
        ),
    ];
    // One batch, so that one claim takes both (a claim waits for a batch's worth of slots).
    let handles = held
        .submit_batch(payloads.into_iter().map(|p| HELD.task(p)).collect())
        .unwrap();
    let running = || -> i64 {
        db.client()
            .query_one(
                "SELECT count(*) FROM tasq_tasks WHERE status = 'running'",
                &[],
            )
            .unwrap()
            .get(0)
    };
    let give_up = std::time::Instant::now() + STEP;
    while running() < 3 && std::time::Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        running(),
        3,
        "the gate runs, the two hostile tasks are held"
    );

    // Shutdown gives the held claims back (dropping their payloads) while the gate still runs.
    let held = Arc::new(held);
    let shutting = Arc::clone(&held);
    let shutdown = std::thread::spawn(move || shutting.shutdown(STEP));
    // The submitted value's own drop called back at submit; the claimed copy's drop at the
    // give-back calls back now.
    let callbacks = callbacks(&seen, 21, 2);
    assert!(
        callbacks
            .iter()
            .all(|c| c.waited == Some(Outcome::Succeeded(21))),
        "{callbacks:?}"
    );
    release.wait();
    let report = shutdown.join().expect("shutdown survives hostile payloads");
    assert_eq!(report.succeeded, 1, "{report:?}");
    assert_eq!(gate.wait_timeout(STEP), Some(Outcome::Succeeded(0)));
    forget_slot(SLOT);

    // Back in the queue, not run, not lost: a later pool runs both.
    let later = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register(HELD, |_, payload: &Hostile| {
            Ok::<_, HandlerError>(payload.n)
        })
        .build()
        .unwrap();
    for (handle, n) in handles.iter().zip([20, 21]) {
        assert_eq!(handle.wait_timeout(STEP), Some(Outcome::Succeeded(n)));
    }
    assert_eq!(later.stats().workers, 1);
    assert_eq!(later.stats().totals.worker_panics, 0);
    later.shutdown(STEP);
    helper.shutdown(STEP);
}
