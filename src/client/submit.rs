//! The typed side of a submit, shared by [`Pool`](crate::Pool) and a handler's
//! [`Context`](crate::Context): a typed task goes into a store as a [`Submission`], and a
//! typed handle comes back.

use crate::client::handle::TaskHandle;
use crate::model::error::{SubmitError, SubmitErrorKind};
use crate::model::id::TaskId;
use crate::model::task::{Task, TaskType, check_key_period};
use crate::store::{Store, Submission};
use crate::sync::Arc;
use crate::unwind;

/// See [`Pool::submit`](crate::Pool::submit).
pub(crate) fn submit<P, O>(
    store: &Arc<dyn Store>,
    task: Task<P, O>,
) -> Result<TaskHandle<O>, SubmitError<Task<P, O>>>
where
    P: Send + 'static,
    O: Send + Sync + 'static,
{
    // A closed pool refuses every task as shut down, without looking further.
    if store.is_closed() {
        return Err(SubmitError::new(SubmitErrorKind::ShutDown, task));
    }
    let (name, priority) = (task.ty.name(), task.priority);
    let submitted = send(store, task, |submission| store.submit(submission))?;
    if !submitted.duplicate {
        crate::observe::trace::submitted(submitted.id, name, priority);
    }
    Ok(TaskHandle::new(
        submitted.id,
        submitted.completion,
        Arc::clone(store.hub()),
        submitted.duplicate,
    ))
}

/// Hands `task` to `store_call` as a [`Submission`]. Accepted: what is left of the task is
/// dropped here, outside the store's lock (a duplicate's payload, and the dependencies'
/// handles, whose completions may hold the last reference to an output: user code, each
/// dropped on its own). Refused: the task comes back whole in the error.
fn send<P, O, R>(
    store: &Arc<dyn Store>,
    task: Task<P, O>,
    store_call: impl FnOnce(Submission<'_>) -> Result<R, SubmitErrorKind>,
) -> Result<R, SubmitError<Task<P, O>>>
where
    P: Send + 'static,
    O: Send + Sync + 'static,
{
    let resolved = store.registry().type_index(task.ty).and_then(|index| {
        check_key_period(task.key.as_deref(), task.key_period)?;
        let settings = store.registry().entry(index).settings_for(&task.own)?;
        Ok((index, settings))
    });
    let (type_index, settings) = match resolved {
        Ok(resolved) => resolved,
        Err(kind) => return Err(SubmitError::new(kind, task)),
    };
    let Task {
        ty,
        payload,
        priority,
        start,
        dependencies,
        key,
        key_period,
        own,
    } = task;
    let mut payload = Some(payload);
    let submitted = store_call(Submission {
        type_index,
        priority,
        start,
        dependencies: &dependencies,
        key: key.as_deref(),
        key_period,
        settings,
        payload: &mut payload,
    });
    match submitted {
        Ok(accepted) => {
            unwind::drop_quietly(payload);
            dependencies.into_iter().for_each(unwind::drop_quietly);
            Ok(accepted)
        }
        Err(kind) => {
            let payload = payload.expect("a refused task keeps its payload");
            let task = Task {
                ty,
                payload,
                priority,
                start,
                dependencies,
                key,
                key_period,
                own,
            };
            Err(SubmitError::new(kind, task))
        }
    }
}

/// See [`Pool::handle`](crate::Pool::handle).
pub(crate) fn handle<P: 'static, O: 'static>(
    store: &Arc<dyn Store>,
    ty: TaskType<P, O>,
    id: TaskId,
) -> Option<TaskHandle<O>> {
    let type_index = store.registry().type_index(ty).ok()?;
    let (index, completion) = store.completion_of(id)?;
    (index == type_index)
        .then(|| TaskHandle::new(id, Some(completion), Arc::clone(store.hub()), false))
}

/// See [`Pool::submit_batch`](crate::Pool::submit_batch).
#[allow(clippy::type_complexity)]
pub(crate) fn submit_batch<P, O>(
    store: &Arc<dyn Store>,
    tasks: Vec<Task<P, O>>,
) -> Result<Vec<TaskHandle<O>>, SubmitError<(usize, Vec<Task<P, O>>)>>
where
    P: Send + 'static,
    O: Send + Sync + 'static,
{
    if store.is_closed() {
        return Err(SubmitError::new(SubmitErrorKind::ShutDown, (0, tasks)));
    }
    // The tasks share payload and output types, not always their type.
    let mut type_indexes = Vec::with_capacity(tasks.len());
    for (index, task) in tasks.iter().enumerate() {
        let resolved = store.registry().type_index(task.ty).and_then(|type_index| {
            check_key_period(task.key.as_deref(), task.key_period)?;
            let settings = store.registry().entry(type_index).settings_for(&task.own)?;
            Ok((type_index, settings))
        });
        match resolved {
            Ok(resolved) => type_indexes.push(resolved),
            Err(kind) => return Err(SubmitError::new(kind, (index, tasks))),
        }
    }
    let mut payloads = Vec::with_capacity(tasks.len());
    let mut rest = Vec::with_capacity(tasks.len());
    for task in tasks {
        let Task {
            ty,
            payload,
            priority,
            start,
            dependencies,
            key,
            key_period,
            own,
        } = task;
        payloads.push(Some(payload));
        rest.push((ty, priority, start, dependencies, (key, key_period), own));
    }
    let mut batch: Vec<Submission<'_>> = payloads
        .iter_mut()
        .zip(&rest)
        .zip(type_indexes)
        .map(
            |(
                (payload, (_, priority, start, dependencies, (key, key_period), _)),
                (type_index, settings),
            )| {
                Submission {
                    type_index,
                    priority: *priority,
                    start: *start,
                    dependencies,
                    key: key.as_deref(),
                    key_period: *key_period,
                    settings,
                    payload,
                }
            },
        )
        .collect();
    let submitted = store.submit_batch(&mut batch);
    drop(batch);
    match submitted {
        Ok(submitted) => {
            // Duplicates' payloads and the dependencies' handles go here, outside any lock.
            payloads
                .into_iter()
                .flatten()
                .for_each(unwind::drop_quietly);
            rest.into_iter()
                .flat_map(|(_, _, _, dependencies, _, _)| dependencies)
                .for_each(unwind::drop_quietly);
            Ok(submitted
                .into_iter()
                .map(|s| TaskHandle::new(s.id, s.completion, Arc::clone(store.hub()), s.duplicate))
                .collect())
        }
        Err((index, kind)) => {
            let tasks = payloads
                .into_iter()
                .zip(rest)
                .map(
                    |(payload, (ty, priority, start, dependencies, (key, key_period), own))| Task {
                        ty,
                        payload: payload.expect("a refused batch keeps its payloads"),
                        priority,
                        start,
                        dependencies,
                        key,
                        key_period,
                        own,
                    },
                )
                .collect();
            Err(SubmitError::new(kind, (index, tasks)))
        }
    }
}

/// See [`Pool::submit_in`](crate::Pool::submit_in).
#[cfg(feature = "postgres")]
pub(crate) fn submit_in<P, O>(
    store: &Arc<dyn Store>,
    tx: &mut postgres::Transaction<'_>,
    task: Task<P, O>,
) -> Result<Receipt, SubmitError<Task<P, O>>>
where
    P: Send + 'static,
    O: Send + Sync + 'static,
{
    let (id, duplicate) = send(store, task, |submission| store.submit_in(tx, submission))?;
    Ok(Receipt { id, duplicate })
}

/// What [`Pool::submit_in`](crate::Pool::submit_in) accepted (feature `postgres`): the task's
/// id, and whether the task's idempotency key made it a duplicate of a task that already held
/// the key ([`is_duplicate`](Receipt::is_duplicate)), as
/// [`TaskHandle::is_duplicate`](crate::TaskHandle::is_duplicate) says for
/// [`Pool::submit`](crate::Pool::submit). No handle: the task exists only once the caller's
/// transaction commits; get one then with [`Pool::handle`](crate::Pool::handle).
///
/// # Examples
///
/// ```no_run
/// use tasq::{HandlerError, Pool, TaskType};
/// const INVOICE: TaskType<u32, ()> = TaskType::new("invoice");
/// let url = "host=127.0.0.1 user=postgres dbname=test";
/// let pool = Pool::builder()
///     .postgres(url)
///     .register(INVOICE, |_, _: &u32| Ok::<_, HandlerError>(()))
///     .build()?;
/// let mut client = postgres::Client::connect(url, postgres::NoTls)?;
/// let mut tx = client.transaction()?;
/// let first = pool.submit_in(&mut tx, INVOICE.task(17).key("invoice-17"))?;
/// let again = pool.submit_in(&mut tx, INVOICE.task(17).key("invoice-17"))?;
/// tx.commit()?;
/// assert_eq!(again.id(), first.id());
/// assert!(!first.is_duplicate() && again.is_duplicate());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "postgres")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use = "the receipt holds the task's id"]
pub struct Receipt {
    id: TaskId,
    duplicate: bool,
}

#[cfg(feature = "postgres")]
impl Receipt {
    /// The task's id: the new task's, or, for a duplicate, that of the task holding the key.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const NOTE: TaskType<String, ()> = TaskType::new("note");
    /// let url = "host=127.0.0.1 user=postgres dbname=test";
    /// let pool = Pool::builder()
    ///     .postgres(url)
    ///     .register(NOTE, |_, _: &String| Ok::<_, HandlerError>(()))
    ///     .build()?;
    /// let mut client = postgres::Client::connect(url, postgres::NoTls)?;
    /// let mut tx = client.transaction()?;
    /// let id = pool.submit_in(&mut tx, NOTE.task("hello".into()))?.id();
    /// tx.commit()?;
    /// assert!(pool.handle(NOTE, id).is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// Whether the task's idempotency key was held by a live or succeeded task, which
    /// [`id`](Receipt::id) names: nothing was added, and the submitted payload was dropped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const NOTE: TaskType<String, ()> = TaskType::new("note");
    /// let url = "host=127.0.0.1 user=postgres dbname=test";
    /// let pool = Pool::builder()
    ///     .postgres(url)
    ///     .register(NOTE, |_, _: &String| Ok::<_, HandlerError>(()))
    ///     .build()?;
    /// let mut client = postgres::Client::connect(url, postgres::NoTls)?;
    /// let mut tx = client.transaction()?;
    /// let receipt = pool.submit_in(&mut tx, NOTE.task("hello".into()).key("note-1"))?;
    /// if receipt.is_duplicate() {
    ///     println!("{} was submitted before", receipt.id());
    /// }
    /// tx.commit()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_duplicate(&self) -> bool {
        self.duplicate
    }
}
