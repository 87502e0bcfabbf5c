//! The pool's dead letters: list them, read a payload, take one out, purge it, or run it again.

use std::any::Any;

use crate::api::pool::Pool;
use crate::client::handle::{Resubmitted, TaskHandle};
use crate::model::dead_letter::DeadLetter;
use crate::model::error::ResubmitError;
use crate::model::id::TaskId;
use crate::model::task::TaskType;
use crate::sync::Arc;
use crate::unwind;

impl Pool {
    /// Every dead letter, oldest id first: a copy of each. Dead letters stay until taken,
    /// resubmitted or purged (up to [`Builder::dead_letter_limit`](crate::Builder::dead_letter_limit)),
    /// whatever the retention of finished tasks. For many, read them a page at a time with
    /// [`dead_letters_after`](Pool::dead_letters_after).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{FailureReason, HandlerError, Pool, TaskType};
    /// const BAD: TaskType<(), ()> = TaskType::new("bad");
    /// let pool = Pool::builder().workers(1).register(BAD, |_, _: &()| Err::<(), _>(HandlerError::permanent("no"))).build()?;
    /// pool.submit(BAD.task(()))?.wait();
    /// assert_eq!(pool.dead_letters()[0].failure.reason, FailureReason::Permanent);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn dead_letters(&self) -> Vec<DeadLetter> {
        self.store.dead_letters(None, None, usize::MAX)
    }

    /// A page of dead letters: at most `limit`, oldest id first, starting after `after` (from
    /// the first with `None`). Pass the last id of a page to get the next.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const BAD: TaskType<u32, ()> = TaskType::new("bad");
    /// let pool = Pool::builder().workers(1).register(BAD, |_, _: &u32| Err::<(), _>(HandlerError::permanent("no"))).build()?;
    /// for n in 0..5 {
    ///     pool.submit(BAD.task(n))?.wait();
    /// }
    /// let mut pages = Vec::new();
    /// let mut after = None;
    /// loop {
    ///     let page = pool.dead_letters_after(after, 2);
    ///     let Some(last) = page.last() else { break };
    ///     after = Some(last.id);
    ///     pages.push(page.len());
    /// }
    /// assert_eq!(pages, [2, 2, 1]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn dead_letters_after(&self, after: Option<TaskId>, limit: usize) -> Vec<DeadLetter> {
        self.store.dead_letters(after, None, limit)
    }

    /// Like [`dead_letters_after`](Pool::dead_letters_after), only those of type `ty`.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const BAD: TaskType<(), ()> = TaskType::new("bad");
    /// const WORSE: TaskType<(), ()> = TaskType::new("worse");
    /// let fail = |_: &tasq::Context<'_>, _: &()| Err::<(), _>(HandlerError::permanent("no"));
    /// let pool = Pool::builder().workers(1).register(BAD, fail).register(WORSE, fail).build()?;
    /// pool.submit(BAD.task(()))?.wait();
    /// pool.submit(WORSE.task(()))?.wait();
    /// let worse = pool.dead_letters_of(WORSE, None, 10);
    /// assert_eq!(worse.len(), 1);
    /// assert_eq!(worse[0].task_type, "worse");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn dead_letters_of<P: 'static, O: 'static>(
        &self,
        ty: TaskType<P, O>,
        after: Option<TaskId>,
        limit: usize,
    ) -> Vec<DeadLetter> {
        match self.store.registry().type_index(ty) {
            Ok(index) => self.store.dead_letters(after, Some(index), limit),
            Err(_) => Vec::new(),
        }
    }

    /// Removes a dead letter for good (its payload is dropped). Returns whether `id` was one.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const BAD: TaskType<(), ()> = TaskType::new("bad");
    /// let pool = Pool::builder().workers(1).register(BAD, |_, _: &()| Err::<(), _>(HandlerError::permanent("no"))).build()?;
    /// let handle = pool.submit(BAD.task(()))?;
    /// handle.wait();
    /// assert!(pool.purge_dead_letter(handle.id()));
    /// assert!(pool.dead_letters().is_empty());
    /// assert!(!pool.purge_dead_letter(handle.id()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn purge_dead_letter(&self, id: TaskId) -> bool {
        self.store.purge_dead_letter(id)
    }

    /// Runs a dead letter of type `ty` again as a new task (same payload, priority and key;
    /// fresh attempts; no dependencies, no delay), and returns the new task's handle. The dead
    /// letter leaves the list; [`info`](Pool::info) of the old task names the new one.
    ///
    /// # Errors
    ///
    /// [`ResubmitError::UnknownTask`], [`ResubmitError::NotDeadLetter`],
    /// [`ResubmitError::AlreadyResubmitted`], [`ResubmitError::Taken`],
    /// [`ResubmitError::TypeMismatch`], [`ResubmitError::KeyTaken`] (another task took its
    /// idempotency key meanwhile) or [`ResubmitError::ShutDown`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const FETCH: TaskType<(), ()> = TaskType::new("fetch");
    /// static UP: AtomicBool = AtomicBool::new(false);
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .register(FETCH, |_, _: &()| {
    ///         if UP.load(Ordering::SeqCst) { Ok(()) } else { Err(HandlerError::permanent("down")) }
    ///     })
    ///     .build()?;
    /// let first = pool.submit(FETCH.task(()))?;
    /// assert!(first.wait().is_failed());
    /// UP.store(true, Ordering::SeqCst);
    /// let again = pool.resubmit(FETCH, first.id())?;
    /// assert!(again.wait().is_succeeded());
    /// assert!(pool.dead_letters().is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resubmit<P: 'static, O: 'static>(
        &self,
        ty: TaskType<P, O>,
        id: TaskId,
    ) -> Result<TaskHandle<O>, ResubmitError> {
        let type_index = self.resubmit_type(ty, id)?;
        let (new, completion) = self.store.resubmit(id, type_index)?;
        Ok(TaskHandle::new(
            new,
            Some(completion),
            Arc::clone(self.store.hub()),
            false,
        ))
    }

    /// Like [`resubmit`](Pool::resubmit), and also brings back the dependents that the dead
    /// letter's failure cancelled (transitively, with the reason
    /// [`DependencyFailed`](crate::CancelReason::DependencyFailed) or a cascade of it): each runs
    /// again as a new task with its payload, priority and key (if no other task took it),
    /// waiting for the new tasks instead of the old ones; their other dependencies stay as they
    /// were. A dependent that retention has forgotten cannot come back, nor one with another
    /// dependency the pool has forgotten (it may have failed), nor the dependents of either.
    /// Their payloads are kept for this until retention drops them.
    ///
    /// # Errors
    ///
    /// As [`resubmit`](Pool::resubmit).
    ///
    /// # Examples
    ///
    /// See [`Resubmitted`].
    pub fn resubmit_with_dependents<P: 'static, O: 'static>(
        &self,
        ty: TaskType<P, O>,
        id: TaskId,
    ) -> Result<Resubmitted<O>, ResubmitError> {
        let type_index = self.resubmit_type(ty, id)?;
        let revived = self.store.resubmit_with_dependents(id, type_index)?;
        Ok(Resubmitted {
            task: TaskHandle::new(
                revived.id,
                Some(revived.completion),
                Arc::clone(self.store.hub()),
                false,
            ),
            dependents: revived.dependents,
        })
    }

    /// Takes a dead letter's payload out of the pool, to inspect it, store it elsewhere or
    /// drop it: the task stays [`Failed`](crate::TaskState::Failed) but leaves the dead letters, and can
    /// no longer be resubmitted. `None` if `id` is not a dead letter of type `ty` (unknown,
    /// not failed, already resubmitted or taken, or of another type).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const IMPORT: TaskType<String, ()> = TaskType::new("import");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .register(IMPORT, |_, row: &String| Err::<(), _>(HandlerError::permanent(format!("bad row {row}"))))
    ///     .build()?;
    /// let handle = pool.submit(IMPORT.task("a;b;;".to_owned()))?;
    /// handle.wait();
    /// assert_eq!(pool.take_dead_letter(IMPORT, handle.id()).as_deref(), Some("a;b;;"));
    /// assert!(pool.dead_letters().is_empty());
    /// assert_eq!(pool.take_dead_letter(IMPORT, handle.id()), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn take_dead_letter<P: 'static, O: 'static>(
        &self,
        ty: TaskType<P, O>,
        id: TaskId,
    ) -> Option<P> {
        let type_index = self.store.registry().type_index(ty).ok()?;
        // Moved out under the store's lock; downcast outside it.
        match self.store.take_dead_letter(id, type_index)?.downcast::<P>() {
            Ok(payload) => Some(*payload),
            Err(other) => {
                unwind::drop_quietly(other);
                None
            }
        }
    }

    /// A copy of a dead letter's payload, to inspect it without taking it: the dead letter
    /// stays as it is, to be resubmitted, taken or purged. `None` if `id` is not a dead letter
    /// of type `ty` (as for [`take_dead_letter`](Pool::take_dead_letter)), or if the copy
    /// failed: the payload's `Clone` panicked (embedded store), or its stored JSON no longer
    /// decodes (durable store).
    ///
    /// On the embedded store the payload's `Clone` runs outside the pool's lock, inside
    /// `catch_unwind`: the payload leaves its record for the copy and comes back after. Meanwhile
    /// the dead letter is still listed; a [`take_dead_letter`](Pool::take_dead_letter) or a
    /// [`resubmit`](Pool::resubmit) from another thread waits for the payload to come back, and
    /// a purge (or the dead-letter limit) goes ahead, the payload dropped when it comes back. A
    /// `Clone` may call back into the pool: for its own dead letter, a copy or a take from it
    /// gets `None`, a resubmit [`ResubmitError::PayloadInUse`] (it cannot wait for itself). On
    /// the durable store the copy is the stored JSON decoded (`Clone` is not called).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const IMPORT: TaskType<String, ()> = TaskType::new("import");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .register(IMPORT, |_, row: &String| Err::<(), _>(HandlerError::permanent(format!("bad row {row}"))))
    ///     .build()?;
    /// let handle = pool.submit(IMPORT.task("a;b;;".to_owned()))?;
    /// handle.wait();
    /// assert_eq!(pool.dead_letter_payload(IMPORT, handle.id()).as_deref(), Some("a;b;;"));
    /// assert_eq!(pool.dead_letters().len(), 1, "still a dead letter");
    /// assert_eq!(pool.take_dead_letter(IMPORT, handle.id()).as_deref(), Some("a;b;;"));
    /// assert_eq!(pool.dead_letter_payload(IMPORT, handle.id()), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn dead_letter_payload<P, O>(&self, ty: TaskType<P, O>, id: TaskId) -> Option<P>
    where
        P: Clone + Send + 'static,
        O: 'static,
    {
        let type_index = self.store.registry().type_index(ty).ok()?;
        let copy = |payload: &(dyn Any + Send)| {
            let copied = payload.downcast_ref::<P>()?.clone();
            Some(Box::new(copied) as Box<dyn Any + Send>)
        };
        match self
            .store
            .dead_letter_payload(id, type_index, &copy)?
            .downcast::<P>()
        {
            Ok(payload) => Some(*payload),
            Err(other) => {
                unwind::drop_quietly(other);
                None
            }
        }
    }

    /// The index of a resubmitted dead letter's type.
    fn resubmit_type<P: 'static, O: 'static>(
        &self,
        ty: TaskType<P, O>,
        id: TaskId,
    ) -> Result<u32, ResubmitError> {
        let registry = self.store.registry();
        registry
            .type_index(ty)
            .map_err(|_| ResubmitError::TypeMismatch(id))
    }
}
