//! Backlog alerts on both stores, on a manual clock: a depth or age alert is raised once when
//! its threshold is reached and cleared once when the backlog falls back under it, whatever the
//! number of checks in between; a priority or type scope looks only at its tasks; an alert on a
//! type the pool does not register fails the build.
//!
//! The monitor checks every second of the pool's clock. A test moves the clock a second, then
//! waits for an event that proves the check at that second happened (an alert whose threshold
//! that check reaches: a witness) before it moves the clock again, so each advance is one check.

mod support_store;

use std::time::Duration;

use crossbeam_channel::Receiver;
use support_store::{GATE, Gate, HANG_GUARD, PROBE, TestBuilder, finish};
use tasq::{Alert, AlertValue, BuildError, Event, HandlerError, ManualClock, TaskHandle, TaskType};

const INTERVAL: Duration = Duration::from_secs(1);

/// A task type of its own, for the per-type scope.
const OTHER: TaskType<(), ()> = TaskType::new("other");

/// One worker on a manual clock, checking alerts every [`INTERVAL`], with `GATE`, `PROBE` and
/// `OTHER` registered and `alerts` set; and the receiver of its events.
fn watched(
    builder: TestBuilder,
    clock: &ManualClock,
    alerts: &[Alert],
) -> (TestBuilder, Receiver<Event>) {
    let builder = alerts.iter().fold(
        builder
            .workers(1)
            .manual_clock(clock.clone())
            .monitor_interval(INTERVAL)
            .with_gates()
            .register(OTHER, |_, _: &()| Ok::<_, HandlerError>(())),
        |builder, &alert| builder.alert(alert),
    );
    builder.events()
}

/// An alert change, as the tests compare them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Raised(Alert, AlertValue),
    Cleared(Alert, AlertValue),
}

fn change(event: Event) -> Change {
    match event {
        Event::AlertRaised { alert, value } => Change::Raised(alert, value),
        Event::AlertCleared { alert, value } => Change::Cleared(alert, value),
        other => panic!("an event nobody asked for: {other}"),
    }
}

/// Moves the clock one interval (one check) and returns the alert changes it made, `count` of
/// them: the test knows how many the check must make, and the last is the witness that the
/// check happened. Anything more shows up in the next call or in [`the_rest`].
fn check(clock: &ManualClock, events: &Receiver<Event>, count: usize) -> Vec<Change> {
    clock.advance(INTERVAL);
    (0..count)
        .map(|i| {
            let event = events
                .recv_timeout(HANG_GUARD)
                .unwrap_or_else(|_| panic!("change {} of the check never came", i + 1));
            change(event)
        })
        .collect()
}

/// The changes left after a shutdown.
fn the_rest(events: &Receiver<Event>) -> Vec<Change> {
    events.try_iter().map(change).collect()
}

/// Waits for every handle to succeed.
fn all_succeed(handles: &[TaskHandle<()>]) {
    for handle in handles {
        assert!(finish(handle).is_succeeded());
    }
}

const AGE_2: Alert = Alert::oldest_ready(Duration::from_secs(2));
const AGE_3: Alert = Alert::oldest_ready(Duration::from_secs(3));
const AGE_4: Alert = Alert::oldest_ready(Duration::from_secs(4));
const AGE_5: Alert = Alert::oldest_ready(Duration::from_secs(5));

conformance! {
    fn a_depth_alert_is_raised_once_and_cleared_once(builder) {
        const DEPTH: Alert = Alert::ready_depth(3);
        // Never reached: it must never report anything, not even a clear at every check.
        const NEVER: Alert = Alert::ready_depth(1000);
        // The age alerts are the witnesses of the checks at seconds 2 to 5.
        let alerts = [DEPTH, NEVER, AGE_2, AGE_3, AGE_4, AGE_5];
        let clock = ManualClock::new();
        let (builder, events) = watched(builder, &clock, &alerts);
        let pool = builder.build();
        let gate = Gate::new();
        let held = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();
        let probes: Vec<_> = (0..3).map(|_| pool.submit(PROBE.task(())).unwrap()).collect();

        assert_eq!(check(&clock, &events, 1), [Change::Raised(DEPTH, AlertValue::Depth(3))]);
        // Four more checks while it stays raised: each reports its witness only.
        for (second, witness) in [(2, AGE_2), (3, AGE_3), (4, AGE_4), (5, AGE_5)] {
            let age = AlertValue::Age(Duration::from_secs(second));
            assert_eq!(check(&clock, &events, 1), [Change::Raised(witness, age)], "second {second}");
        }

        gate.open();
        all_succeed(&probes);
        assert!(finish(&held).is_succeeded());
        let age = AlertValue::Age(Duration::ZERO);
        assert_eq!(
            check(&clock, &events, 5),
            [
                Change::Cleared(DEPTH, AlertValue::Depth(0)),
                Change::Cleared(AGE_2, age),
                Change::Cleared(AGE_3, age),
                Change::Cleared(AGE_4, age),
                Change::Cleared(AGE_5, age),
            ]
        );
        let report = pool.shutdown(HANG_GUARD);
        assert!(!report.deadline_reached);
        assert_eq!(the_rest(&events), Vec::new(), "no alert repeats, and NEVER never reported");
    }

    fn an_age_alert_is_raised_when_the_oldest_ready_task_has_waited_its_threshold(builder) {
        const OLD: Alert = Alert::oldest_ready(Duration::from_secs(3));
        // The witness of the first check.
        const ANY: Alert = Alert::ready_depth(1);
        let clock = ManualClock::new();
        let (builder, events) = watched(builder, &clock, &[OLD, ANY]);
        let pool = builder.build();
        let gate = Gate::new();
        let held = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();
        let probe = pool.submit(PROBE.task(())).unwrap();

        // Second 1: the probe has waited one second. OLD comes first in the check, so an early
        // raise would arrive before the witness.
        assert_eq!(check(&clock, &events, 1), [Change::Raised(ANY, AlertValue::Depth(1))]);
        // A newer task does not make the oldest younger.
        let newer = pool.submit(PROBE.task(())).unwrap();
        // Second 2: nothing changes, so nothing witnesses the check; second 3 raises OLD, with
        // the age it measured (an early raise at second 2 would say 2 s).
        clock.advance(INTERVAL);
        assert_eq!(
            check(&clock, &events, 1),
            [Change::Raised(OLD, AlertValue::Age(Duration::from_secs(3)))]
        );

        gate.open();
        all_succeed(&[probe, newer]);
        assert!(finish(&held).is_succeeded());
        assert_eq!(
            check(&clock, &events, 2),
            [
                Change::Cleared(OLD, AlertValue::Age(Duration::ZERO)),
                Change::Cleared(ANY, AlertValue::Depth(0)),
            ]
        );
        let report = pool.shutdown(HANG_GUARD);
        assert!(!report.deadline_reached);
        assert_eq!(the_rest(&events), Vec::new());
    }

    fn priority_and_type_scopes_look_only_at_their_tasks(builder) {
        const URGENT: Alert = Alert::ready_depth(2).priority(5);
        const OTHERS: Alert = Alert::ready_depth(2).task_type("other");
        const URGENT_OLD: Alert = Alert::oldest_ready(Duration::from_secs(3)).priority(5);
        // Pool-wide witnesses.
        const THREE: Alert = Alert::ready_depth(3);
        const FIVE: Alert = Alert::ready_depth(5);
        const SIX: Alert = Alert::ready_depth(6);
        let alerts = [URGENT, OTHERS, URGENT_OLD, THREE, FIVE, SIX];
        let clock = ManualClock::new();
        let (builder, events) = watched(builder, &clock, &alerts);
        let pool = builder.build();
        let gate = Gate::new();
        let held = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();
        let mut probes = Vec::new();
        let mut others = Vec::new();

        // Second 1: three probes of priority 0.
        for _ in 0..3 {
            probes.push(pool.submit(PROBE.task(())).unwrap());
        }
        assert_eq!(check(&clock, &events, 1), [Change::Raised(THREE, AlertValue::Depth(3))]);

        // Second 2: one urgent probe, one `other` of priority 0: each scope has one.
        probes.push(pool.submit(PROBE.task(()).priority(5)).unwrap());
        others.push(pool.submit(OTHER.task(())).unwrap());
        assert_eq!(check(&clock, &events, 1), [Change::Raised(FIVE, AlertValue::Depth(5))]);

        // Second 3: an urgent `other`: two in each scope. The pool's oldest task has waited
        // 3 s, the oldest urgent one 2 s: URGENT_OLD must wait.
        others.push(pool.submit(OTHER.task(()).priority(5)).unwrap());
        assert_eq!(
            check(&clock, &events, 3),
            [
                Change::Raised(URGENT, AlertValue::Depth(2)),
                Change::Raised(OTHERS, AlertValue::Depth(2)),
                Change::Raised(SIX, AlertValue::Depth(6)),
            ]
        );
        // Second 4: the oldest urgent task has waited 3 s.
        assert_eq!(
            check(&clock, &events, 1),
            [Change::Raised(URGENT_OLD, AlertValue::Age(Duration::from_secs(3)))]
        );

        gate.open();
        all_succeed(&probes);
        all_succeed(&others);
        assert!(finish(&held).is_succeeded());
        let none = AlertValue::Depth(0);
        assert_eq!(
            check(&clock, &events, 6),
            [
                Change::Cleared(URGENT, none),
                Change::Cleared(OTHERS, none),
                Change::Cleared(URGENT_OLD, AlertValue::Age(Duration::ZERO)),
                Change::Cleared(THREE, none),
                Change::Cleared(FIVE, none),
                Change::Cleared(SIX, none),
            ]
        );
        let report = pool.shutdown(HANG_GUARD);
        assert!(!report.deadline_reached);
        assert_eq!(the_rest(&events), Vec::new());
    }

    fn an_alert_on_a_type_the_pool_does_not_register_fails_the_build(builder) {
        let built = builder
            .workers(1)
            .register(OTHER, |_, _: &()| Ok::<_, HandlerError>(()))
            .alert(Alert::ready_depth(1).task_type("unregistered"))
            .try_build();
        match built {
            Err(BuildError::InvalidSetting { setting, of, .. }) => {
                assert_eq!((setting, of), ("an alert", "unregistered"));
            }
            Err(other) => panic!("the wrong error: {other}"),
            Ok(_) => panic!("a pool with an alert on an unregistered type was built"),
        }
    }
}
