//! `Pool::dead_letter_payload` on the embedded store, with hostile payloads: the copy is the
//! payload's `Clone` (user code), run outside the pool's lock and inside `catch_unwind`, while
//! the payload is out of its record. A `Clone` that panics, one that calls back into the pool
//! for its own dead letter, and another thread taking the dead letter during the copy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock, Weak};
use std::time::Duration;

use tasq::{HandlerError, Pool, ResubmitError, TaskId, TaskType};

/// How long a test waits for something that should happen soon; never slept.
const GUARD: Duration = Duration::from_secs(20);
const EXPECTED: &str = "[expected panic]";

fn silence_expected_panics() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
            if !message.is_some_and(|m| m.contains(EXPECTED)) {
                default(info);
            }
        }));
    });
}

/// A payload whose `Clone` runs a callback first, and whose drops are counted.
struct Hostile {
    n: u32,
    on_clone: Arc<dyn Fn() + Send + Sync>,
    drops: Arc<AtomicUsize>,
}

impl Clone for Hostile {
    fn clone(&self) -> Self {
        (self.on_clone)();
        Hostile {
            n: self.n,
            on_clone: Arc::clone(&self.on_clone),
            drops: Arc::clone(&self.drops),
        }
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

/// Fails every task permanently: each one a dead letter.
const DOOMED: TaskType<Hostile, ()> = TaskType::new("doomed");

fn pool() -> Arc<Pool> {
    silence_expected_panics();
    Arc::new(
        Pool::builder()
            .workers(1)
            .register(DOOMED, |_, _: &Hostile| {
                Err::<(), _>(HandlerError::permanent("doomed"))
            })
            .build()
            .unwrap(),
    )
}

/// Submits a dead letter whose `Clone` runs `on_clone`, and waits for it to fail.
fn dead_letter(
    pool: &Pool,
    n: u32,
    on_clone: impl Fn() + Send + Sync + 'static,
) -> (TaskId, Arc<AtomicUsize>) {
    let drops = Arc::new(AtomicUsize::new(0));
    let payload = Hostile {
        n,
        on_clone: Arc::new(on_clone),
        drops: Arc::clone(&drops),
    };
    let handle = pool.submit(DOOMED.task(payload)).unwrap();
    assert!(handle.wait_timeout(GUARD).expect("it fails").is_failed());
    (handle.id(), drops)
}

#[test]
fn a_clone_that_panics_leaves_the_dead_letter_as_it_was() {
    let pool = pool();
    let (id, drops) = dead_letter(&pool, 1, || panic!("{EXPECTED} the payload's clone"));
    assert!(pool.dead_letter_payload(DOOMED, id).is_none());
    assert_eq!(drops.load(Ordering::SeqCst), 0, "the payload went back");
    pool.check_invariants().unwrap();
    let listed: Vec<TaskId> = pool.dead_letters().iter().map(|d| d.id).collect();
    assert_eq!(listed, [id]);
    let taken = pool.take_dead_letter(DOOMED, id).expect("still there");
    assert_eq!(taken.n, 1);
}

#[test]
fn a_clone_that_calls_back_into_the_pool_for_its_own_dead_letter() {
    let pool = pool();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let me: Arc<OnceLock<(Weak<Pool>, TaskId)>> = Arc::default();
    let (in_clone, log) = (Arc::clone(&me), Arc::clone(&seen));
    let (id, drops) = dead_letter(&pool, 2, move || {
        let Some((pool, id)) = in_clone.get() else {
            return;
        };
        let pool = pool.upgrade().expect("the pool");
        let id = *id;
        let mut log = log.lock().unwrap();
        // Its own dead letter, lent to this very thread: refused, never waited for.
        log.push(format!(
            "copy {:?}",
            pool.dead_letter_payload(DOOMED, id).map(|p| p.n)
        ));
        log.push(format!(
            "take {:?}",
            pool.take_dead_letter(DOOMED, id).map(|p| p.n)
        ));
        log.push(format!("resubmit {:?}", pool.resubmit(DOOMED, id).err()));
        log.push(format!("listed {}", pool.dead_letters().len()));
        log.push(format!("stats {}", pool.stats().dead_letters));
        // A purge goes ahead: the payload is dropped when it comes back.
        log.push(format!("purge {}", pool.purge_dead_letter(id)));
    });
    me.set((Arc::downgrade(&pool), id)).ok().unwrap();

    let copy = pool
        .dead_letter_payload(DOOMED, id)
        .expect("the copy made before the purge");
    assert_eq!(copy.n, 2);
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "copy None".to_owned(),
            "take None".to_owned(),
            format!("resubmit {:?}", Some(ResubmitError::PayloadInUse(id))),
            "listed 1".to_owned(),
            "stats 1".to_owned(),
            "purge true".to_owned(),
        ]
    );
    assert_eq!(
        drops.load(Ordering::SeqCst),
        1,
        "the purged payload, once back"
    );
    drop(copy);
    assert_eq!(drops.load(Ordering::SeqCst), 2);
    assert!(pool.dead_letters().is_empty());
    assert!(pool.take_dead_letter(DOOMED, id).is_none());
    pool.check_invariants().unwrap();
}

#[test]
fn a_take_from_another_thread_waits_for_the_copy() {
    let pool = pool();
    let me: Arc<OnceLock<(Weak<Pool>, TaskId)>> = Arc::default();
    let (in_clone, early) = (Arc::clone(&me), Arc::new(Mutex::new(None)));
    let (taker_out, early_out) = (Arc::new(Mutex::new(None)), Arc::clone(&early));
    let taker_slot = Arc::clone(&taker_out);
    let (id, drops) = dead_letter(&pool, 3, move || {
        let Some((pool, id)) = in_clone.get() else {
            return;
        };
        let (pool, id) = (pool.upgrade().expect("the pool"), *id);
        // Another thread takes the dead letter while its payload is out for this copy.
        let (tx, rx) = crossbeam_channel::bounded(1);
        let taker = std::thread::spawn(move || {
            let taken = pool.take_dead_letter(DOOMED, id).map(|p| p.n);
            let _ = tx.send(taken);
            taken
        });
        // Bounds a wait for what must not come: the take waits for the payload to come back,
        // so nothing arrives while this copy runs (a take that found no payload would say None
        // here). The test holds whatever the timing.
        *early_out.lock().unwrap() = rx.recv_timeout(Duration::from_millis(200)).ok();
        *taker_slot.lock().unwrap() = Some(taker);
    });
    me.set((Arc::downgrade(&pool), id)).ok().unwrap();

    let copy = pool.dead_letter_payload(DOOMED, id).expect("a copy");
    assert_eq!(copy.n, 3);
    assert_eq!(
        *early.lock().unwrap(),
        None,
        "the take did not wait for the copy"
    );
    let taker = taker_out.lock().unwrap().take().expect("the clone ran");
    assert_eq!(
        taker.join().unwrap(),
        Some(3),
        "the take got the payload back"
    );
    assert!(pool.dead_letters().is_empty());
    drop(copy);
    assert_eq!(
        drops.load(Ordering::SeqCst),
        2,
        "the copy and the taken payload"
    );
    pool.check_invariants().unwrap();
}
