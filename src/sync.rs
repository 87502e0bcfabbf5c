//! The one module that names `parking_lot` or `loom`: locks, condition variables, atomics and threads.
//!
//! Normal builds use `parking_lot`'s `Mutex` and `Condvar` and `std`'s threads; builds with
//! `RUSTFLAGS="--cfg tasq_loom"` use `loom`'s, so the model checker explores the engine's own code.
//! Both sides expose the same small API: `Mutex::lock`, `Condvar::{wait, wait_until, notify_one,
//! notify_all}`, the atomics, and [`spawn`].
//!
//! loom's condition variable never times out: under `cfg(tasq_loom)` [`Condvar::wait_until`] is a plain
//! wait. Nothing that keeps the pool making progress may therefore rely on a timed wait firing; time
//! moves in models through the manual clock, which notifies its sleepers (see `src/clock.rs`).

#![allow(unreachable_pub)]

pub use std::sync::{Arc, Weak};

/// Thread-locals: loom's under loom, whose threads share one OS thread.
#[cfg(tasq_loom)]
pub use loom::thread_local;
#[cfg(not(tasq_loom))]
pub use std::thread_local;

#[cfg(not(tasq_loom))]
pub use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

#[cfg(tasq_loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// An unbounded multi-producer multi-consumer queue that pushes and pops without a lock: the
/// intake of plain submits (`src/store/memory/intake.rs`). crossbeam's `SegQueue` in normal
/// builds; under loom, a loom mutex around a `VecDeque` (crossbeam's atomics are invisible to
/// the model checker, and the intake's protocol relies only on pushes and pops being atomic).
#[cfg(not(tasq_loom))]
pub type Queue<T> = crossbeam_queue::SegQueue<T>;

#[cfg(tasq_loom)]
pub use imp::Queue;

/// Lets other threads run: for the one short wait that spins (closing, for producers between
/// taking an id and announcing their task). loom must see it to explore what they do meanwhile.
#[cfg(not(tasq_loom))]
pub use std::thread::yield_now;

#[cfg(tasq_loom)]
pub use loom::thread::yield_now;

// ===== parking_lot (normal builds) =====

#[cfg(not(tasq_loom))]
mod imp {
    use std::time::Instant;

    /// A mutual-exclusion lock without poisoning.
    #[derive(Debug, Default)]
    pub struct Mutex<T>(parking_lot::Mutex<T>);

    /// The guard of a locked [`Mutex`].
    pub type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub fn new(value: T) -> Self {
            Mutex(parking_lot::Mutex::new(value))
        }

        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }

        pub fn get_mut(&mut self) -> &mut T {
            self.0.get_mut()
        }
    }

    /// A condition variable used with [`Mutex`].
    #[derive(Debug, Default)]
    pub struct Condvar(parking_lot::Condvar);

    impl Condvar {
        pub fn new() -> Self {
            Condvar(parking_lot::Condvar::new())
        }

        /// Blocks until notified (or spuriously woken): callers loop on their condition.
        pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            self.0.wait(guard);
        }

        /// Blocks until notified, spuriously woken, or `deadline` passes.
        pub fn wait_until<T>(&self, guard: &mut MutexGuard<'_, T>, deadline: Instant) {
            self.0.wait_until(guard, deadline);
        }

        pub fn notify_one(&self) {
            self.0.notify_one();
        }

        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    pub type JoinHandle = std::thread::JoinHandle<()>;

    /// Spawns a named thread.
    pub fn spawn<F>(name: String, stack_size: Option<usize>, f: F) -> std::io::Result<JoinHandle>
    where
        F: FnOnce() + Send + 'static,
    {
        let mut builder = std::thread::Builder::new().name(name);
        if let Some(size) = stack_size {
            builder = builder.stack_size(size);
        }
        builder.spawn(f)
    }

    pub type ThreadId = std::thread::ThreadId;

    pub fn current_thread_id() -> ThreadId {
        std::thread::current().id()
    }

    pub fn thread_id(handle: &JoinHandle) -> ThreadId {
        handle.thread().id()
    }
}

// ===== loom (cfg(tasq_loom)) =====

#[cfg(tasq_loom)]
mod imp {
    use std::ops::{Deref, DerefMut};
    use std::time::Instant;

    /// A mutual-exclusion lock (loom's, poisoning ignored: a panic in a model fails the model).
    #[derive(Debug)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);

    /// The guard of a locked [`Mutex`]; the `Option` lets [`Condvar::wait`] take it by `&mut`.
    #[derive(Debug)]
    pub struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    impl<T> Mutex<T> {
        pub fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap()))
        }

        pub fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap()
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Mutex::new(T::default())
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().expect("guard present outside a wait")
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().expect("guard present outside a wait")
        }
    }

    /// A condition variable used with [`Mutex`].
    #[derive(Debug, Default)]
    pub struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub fn new() -> Self {
            Condvar(loom::sync::Condvar::new())
        }

        pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let inner = guard.0.take().expect("guard present");
            guard.0 = Some(self.0.wait(inner).unwrap());
        }

        /// loom never times out: this is a plain wait.
        pub fn wait_until<T>(&self, guard: &mut MutexGuard<'_, T>, _deadline: Instant) {
            self.wait(guard);
        }

        pub fn notify_one(&self) {
            self.0.notify_one();
        }

        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    #[derive(Debug)]
    pub struct Queue<T>(loom::sync::Mutex<std::collections::VecDeque<T>>);

    impl<T> Queue<T> {
        pub fn new() -> Self {
            Queue(loom::sync::Mutex::new(std::collections::VecDeque::new()))
        }

        pub fn push(&self, value: T) {
            self.0.lock().unwrap().push_back(value);
        }

        pub fn pop(&self) -> Option<T> {
            self.0.lock().unwrap().pop_front()
        }

        pub fn is_empty(&self) -> bool {
            self.0.lock().unwrap().is_empty()
        }
    }

    pub type JoinHandle = loom::thread::JoinHandle<()>;

    pub fn spawn<F>(name: String, _stack_size: Option<usize>, f: F) -> std::io::Result<JoinHandle>
    where
        F: FnOnce() + Send + 'static,
    {
        loom::thread::Builder::new().name(name).spawn(f)
    }

    pub type ThreadId = loom::thread::ThreadId;

    pub fn current_thread_id() -> ThreadId {
        loom::thread::current().id()
    }

    pub fn thread_id(handle: &JoinHandle) -> ThreadId {
        handle.thread().id()
    }
}

pub use imp::*;
