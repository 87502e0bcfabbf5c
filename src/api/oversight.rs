//! The `Builder` settings of what watches over a pool: event hooks (and whether they hear each
//! task's life), alerts, breakers, aging, the stuck-handler grace and the monitor's interval.
//! What they set is the builder's `Oversight`.

use crate::api::builder::Builder;
use crate::gates::aging::Aging;
use crate::gates::breaker::Breaker;
use crate::observe::alert::Alert;
use crate::observe::event::Event;

impl<S> Builder<S> {
    /// Calls `hook` with every [`Event`] of the pool: each dead letter, each stuck handler,
    /// each breaker change, each alert raised or cleared. Hooks run in order on one thread of
    /// their own (never on a worker, never under a lock), each inside `catch_unwind`: a hook
    /// that panics misses that event only. A hook may call back into the pool. Events are
    /// delivered until the pool shuts down ([`Pool::shutdown`](crate::Pool::shutdown) returns
    /// after the hooks have seen every event before it) or is dropped. May be called more than
    /// once; each hook sees every event. Defaults to none (and then no thread).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use tasq::{Event, HandlerError, Pool, TaskType};
    ///
    /// const CHARGE: TaskType<u32, ()> = TaskType::new("charge");
    /// let (tx, rx) = mpsc::channel();
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .on_event(move |event: &Event| {
    ///         if let Event::DeadLetter { id, .. } = event {
    ///             let _ = tx.send(*id);
    ///         }
    ///     })
    ///     .register(CHARGE, |_, _: &u32| Err::<(), _>(HandlerError::permanent("card declined")))
    ///     .build()?;
    /// let handle = pool.submit(CHARGE.task(5))?;
    /// assert_eq!(rx.recv()?, handle.id());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_event<F>(mut self, hook: F) -> Self
    where
        F: FnMut(&Event) + Send + 'static,
    {
        self.oversight.hooks.push(Box::new(hook));
        self
    }

    /// Tells the [`on_event`](Builder::on_event) hooks of every task's ordinary life as well:
    /// [`Event::Submitted`], [`Event::Started`], [`Event::Succeeded`], [`Event::Retrying`] and
    /// [`Event::Cancelled`] (a failure is always told, as its [`Event::DeadLetter`]). Each is
    /// about what this pool did: its submits, its workers' runs, the endings it recorded. They
    /// reach the hooks in order per task, on the hooks' own thread, after the store recorded
    /// them. Without this (the default) they are never made: one `bool` check each. With
    /// `tracing`, the same moments are `debug` events on target `tasq` whatever this says.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use tasq::{Event, HandlerError, Pool, TaskType};
    ///
    /// const PING: TaskType<(), ()> = TaskType::new("ping");
    /// let (tx, rx) = mpsc::channel();
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .lifecycle_events(true)
    ///     .on_event(move |event: &Event| {
    ///         let _ = tx.send(event.clone());
    ///     })
    ///     .register(PING, |_, _: &()| Ok::<_, HandlerError>(()))
    ///     .build()?;
    /// let id = pool.submit(PING.task(()))?.id();
    /// pool.wait_idle();
    /// let seen: Vec<Event> = rx.iter().take(3).collect();
    /// assert!(matches!(seen[0], Event::Submitted { id: i, .. } if i == id));
    /// assert!(matches!(seen[1], Event::Started { attempt: 1, .. }));
    /// assert!(matches!(seen[2], Event::Succeeded { attempt: 1, .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lifecycle_events(mut self, on: bool) -> Self {
        self.oversight.lifecycle = on;
        self
    }

    /// Adds a backlog alert: a threshold on the ready tasks' depth or age, checked every
    /// [`monitor_interval`](Builder::monitor_interval), reported once when reached and once
    /// when cleared. An alert on a type the pool does not register makes the build fail with
    /// [`BuildError::InvalidSetting`](crate::BuildError::InvalidSetting). Defaults to none.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::Alert;
    /// let builder = tasq::Pool::builder()
    ///     .alert(Alert::ready_depth(10_000))
    ///     .alert(Alert::oldest_ready(Duration::from_secs(60)).priority(0));
    /// # let _ = builder;
    /// ```
    pub fn alert(mut self, alert: Alert) -> Self {
        self.oversight.alerts.push(alert);
        self
    }

    /// Gives the downstream `name` a circuit breaker; task types name their downstream with
    /// [`TypeOptions::downstream`](crate::TypeOptions::downstream). On the durable store the breaker's state is shared by every
    /// pool on the database (a row per downstream): they open, probe and close together. Any
    /// success of the downstream's tasks closes it, the probe's or a run's that began before it
    /// opened (see [`Breaker`]'s states). A name given twice, or zero failures, makes the build
    /// fail with [`BuildError::InvalidSetting`](crate::BuildError::InvalidSetting).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{Breaker, HandlerError, Pool, TaskType, TypeOptions};
    ///
    /// const CHARGE: TaskType<u32, ()> = TaskType::new("charge");
    /// const REFUND: TaskType<u32, ()> = TaskType::new("refund");
    /// let pool = Pool::builder()
    ///     .breaker("payments", Breaker::new(5, Duration::from_secs(30)))
    ///     .register_with(CHARGE, TypeOptions::new().downstream("payments"), |_, _: &u32| Ok::<_, HandlerError>(()))
    ///     .register_with(REFUND, TypeOptions::new().downstream("payments"), |_, _: &u32| Ok::<_, HandlerError>(()))
    ///     .build()?;
    /// assert_eq!(pool.stats().breakers, [("payments", tasq::BreakerState::Closed)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn breaker(mut self, name: &'static str, breaker: Breaker) -> Self {
        self.oversight.breakers.push((name, breaker));
        self
    }

    /// Lets ready tasks age: their priority rises the longer they wait, up to a ceiling (see
    /// [`Aging`] for the bound this gives). Defaults to strict priority: no aging.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = tasq::Pool::builder().aging(tasq::Aging::new(Duration::from_secs(10), 9));
    /// # let _ = builder;
    /// ```
    pub fn aging(mut self, aging: Aging) -> Self {
        self.oversight.aging = Some(aging);
        self
    }

    /// How long past its timeout ([`TypeOptions::timeout`](crate::TypeOptions::timeout)) a handler may still run before it
    /// is reported stuck. Defaults to 10 seconds.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = tasq::Pool::builder().stuck_after(std::time::Duration::from_secs(60));
    /// # let _ = builder;
    /// ```
    pub fn stuck_after(mut self, grace: std::time::Duration) -> Self {
        self.oversight.stuck_after = grace;
        self
    }

    /// How often the pool checks its [alerts](Builder::alert), on its clock. Zero makes the
    /// build fail with [`BuildError::InvalidSetting`](crate::BuildError::InvalidSetting). Defaults to one second.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = tasq::Pool::builder().monitor_interval(std::time::Duration::from_millis(250));
    /// # let _ = builder;
    /// ```
    pub fn monitor_interval(mut self, interval: std::time::Duration) -> Self {
        self.oversight.monitor_interval = interval;
        self
    }
}
