//! What the command prints: a table for a person, or JSON for a script, of each thing it reads.
//!
//! Every text that came from users (types, keys, errors, payloads) is printed as it is in
//! JSON (escaped by serde_json) and, in tables, with control characters shown as escapes, so
//! that a payload cannot move the terminal's cursor or change its colours.

use std::time::{Duration, SystemTime};

use comfy_table::{Table, presets::UTF8_BORDERS_ONLY};
use serde_json::{Value, json};
use tasq::console::{BulkOutcome, Overview, TaskDetail, TaskPage, TaskRow};
use tasq::{
    BreakerState, CancelOutcome, PauseTarget, Paused, QueueLimit, ScheduleInfo, TaskId, TaskState,
};

/// A state's name, as the command writes and reads it.
pub fn state_name(state: TaskState) -> String {
    state.to_string()
}

/// A breaker state's name.
fn breaker_name(state: BreakerState) -> &'static str {
    match state {
        BreakerState::Closed => "closed",
        BreakerState::Open => "open",
        BreakerState::HalfOpen => "half open",
        _ => "unknown",
    }
}

/// A time as RFC 3339, to the second, in UTC.
pub fn time(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

/// A duration to the tenth of a second (`1h 2m 3.4s`).
pub fn age(d: Duration) -> String {
    let rounded = Duration::from_millis(d.as_millis() as u64 / 100 * 100);
    humantime::format_duration(rounded).to_string()
}

/// Text that came from users, made safe for a terminal: control characters (escape sequences,
/// carriage returns) shown escaped, and cut to `max` characters.
pub fn safe(text: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A task id as the command shows it: the number in this queue.
pub fn short(id: TaskId) -> String {
    id.seq().to_string()
}

fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_BORDERS_ONLY);
    table.set_header(header.iter().copied());
    table
}

/// The figures of `tasq stats`.
pub fn overview(o: &Overview, json_out: bool) -> String {
    if json_out {
        return json!({
            "at": time(o.at),
            "estimated": o.estimated,
            "states": {
                "blocked": o.states.blocked, "scheduled": o.states.scheduled,
                "ready": o.states.ready, "running": o.states.running,
                "succeeded": o.states.succeeded, "failed": o.states.failed,
                "cancelled": o.states.cancelled, "dead": o.states.dead,
            },
            "oldest_ready_seconds": o.oldest_ready.map(|d| d.as_secs_f64()),
            "ready_by_priority": o.ready_by_priority.iter()
                .map(|(p, n)| json!({"priority": p, "ready": n})).collect::<Vec<_>>(),
            "queues": o.queues.iter().map(|q| json!({
                "name": q.name, "ready": q.ready, "running": q.running,
                "oldest_ready_seconds": q.oldest_ready.map(|d| d.as_secs_f64()),
                "paused": q.paused, "limit": q.limit,
            })).collect::<Vec<_>>(),
            "types": o.types.iter().map(|t| json!({
                "name": t.name, "ready": t.ready, "running": t.running, "dead": t.dead,
                "oldest_ready_seconds": t.oldest_ready.map(|d| d.as_secs_f64()),
                "paused": t.paused,
            })).collect::<Vec<_>>(),
            "minutes": o.minutes.iter().map(|m| json!({
                "at": time(m.at), "succeeded": m.succeeded, "failed": m.failed,
                "cancelled": m.cancelled, "complete": m.complete,
            })).collect::<Vec<_>>(),
            "throughput_per_second": o.throughput,
            "paused": o.paused.iter().map(paused_json).collect::<Vec<_>>(),
            "breakers": o.breakers.iter().map(|b| json!({
                "downstream": b.downstream, "state": breaker_name(b.state),
                "consecutive_failures": b.consecutive_failures,
                "opened_at": b.opened_at.map(time),
            })).collect::<Vec<_>>(),
        })
        .to_string();
    }
    let s = &o.states;
    let about = if o.estimated {
        " (~: at least, or estimated)"
    } else {
        ""
    };
    let mut out = format!("tasks at {}{about}\n", time(o.at));
    let mut states = table(&[
        "blocked",
        "scheduled",
        "ready",
        "running",
        "succeeded",
        "failed",
        "dead",
        "cancelled",
    ]);
    states.add_row([
        s.blocked,
        s.scheduled,
        s.ready,
        s.running,
        s.succeeded,
        s.failed,
        s.dead,
        s.cancelled,
    ]);
    out += &format!("{states}\n");
    out += &format!(
        "oldest ready: {}   throughput: {:.1}/s\n",
        o.oldest_ready.map_or("-".to_owned(), age),
        o.throughput
    );
    if !o.ready_by_priority.is_empty() {
        let by: Vec<String> = o
            .ready_by_priority
            .iter()
            .map(|(p, n)| format!("{p}: {n}"))
            .collect();
        out += &format!("ready by priority: {}\n", by.join(", "));
    }
    if !o.queues.is_empty() {
        let mut queues = table(&[
            "queue",
            "ready",
            "running",
            "oldest ready",
            "limit",
            "paused",
        ]);
        for q in &o.queues {
            queues.add_row([
                safe(&q.name, 40),
                q.ready.to_string(),
                q.running.to_string(),
                q.oldest_ready.map_or("-".to_owned(), age),
                q.limit.map_or("-".to_owned(), |n| n.to_string()),
                if q.paused {
                    "paused".to_owned()
                } else {
                    String::new()
                },
            ]);
        }
        out += &format!("{queues}\n");
    }
    if !o.types.is_empty() {
        let mut types = table(&["type", "ready", "running", "dead", "oldest ready", "paused"]);
        for t in &o.types {
            types.add_row([
                safe(&t.name, 40),
                t.ready.to_string(),
                t.running.to_string(),
                t.dead.to_string(),
                t.oldest_ready.map_or("-".to_owned(), age),
                if t.paused {
                    "paused".to_owned()
                } else {
                    String::new()
                },
            ]);
        }
        out += &format!("{types}\n");
    }
    let mut minutes = table(&["minute", "succeeded", "failed", "cancelled"]);
    for m in o.minutes.iter().rev().take(5) {
        let mark = if m.complete { "" } else { "~" };
        minutes.add_row([
            time(m.at),
            format!("{mark}{}", m.succeeded),
            format!("{mark}{}", m.failed),
            format!("{mark}{}", m.cancelled),
        ]);
    }
    out += &format!("{minutes}\n");
    for b in &o.breakers {
        out += &format!(
            "breaker {}: {} ({} failures in a row)\n",
            safe(&b.downstream, 40),
            breaker_name(b.state),
            b.consecutive_failures
        );
    }
    for p in &o.paused {
        out += &format!("paused: {}\n", target_name(&p.target));
    }
    out
}

/// `queue mail`, `type email`, `schedule nightly`.
pub fn target_name(target: &PauseTarget) -> String {
    match target {
        PauseTarget::Queue(name) => format!("queue {}", safe(name, 63)),
        PauseTarget::Type(name) => format!("type {}", safe(name, 100)),
        PauseTarget::Schedule(name) => format!("schedule {}", safe(name, 63)),
    }
}

fn paused_json(p: &Paused) -> Value {
    let (kind, name) = match &p.target {
        PauseTarget::Queue(name) => ("queue", name),
        PauseTarget::Type(name) => ("type", name),
        PauseTarget::Schedule(name) => ("schedule", name),
    };
    json!({"kind": kind, "name": name, "since": time(p.since)})
}

fn row_json(t: &TaskRow) -> Value {
    json!({
        "id": format!("{}:{}", t.id.pool(), t.id.seq()),
        "seq": t.id.seq(),
        "type": t.task_type,
        "queue": t.queue,
        "state": state_name(t.state),
        "dead": t.dead,
        "priority": t.priority,
        "attempts": t.attempts,
        "max_attempts": t.max_attempts,
        "run_at": t.run_at.map(time),
        "key": t.key,
        "last_error": t.last_error,
        "created_at": t.created_at.map(time),
        "finished_at": t.finished_at.map(time),
    })
}

/// A page of `tasq tasks list` or `tasq dead list`.
pub fn page(page: &TaskPage, json_out: bool) -> String {
    if json_out {
        return json!({
            "tasks": page.tasks.iter().map(row_json).collect::<Vec<_>>(),
            "next": page.next.map(|id| format!("{}:{}", id.pool(), id.seq())),
        })
        .to_string();
    }
    let mut t = table(&[
        "id",
        "type",
        "queue",
        "state",
        "prio",
        "attempts",
        "key",
        "last error",
    ]);
    for row in &page.tasks {
        let state = if row.dead {
            "dead".to_owned()
        } else {
            state_name(row.state).to_owned()
        };
        t.add_row([
            short(row.id),
            safe(&row.task_type, 30),
            safe(&row.queue, 20),
            state,
            row.priority.to_string(),
            format!("{}/{}", row.attempts, row.max_attempts),
            row.key.as_deref().map_or(String::new(), |k| safe(k, 24)),
            row.last_error
                .as_deref()
                .map_or(String::new(), |e| safe(e, 48)),
        ]);
    }
    let mut out = format!("{t}\n");
    match page.next {
        Some(next) => out += &format!("more: --after {}\n", short(next)),
        None => out += &format!("{} tasks, no more\n", page.tasks.len()),
    }
    out
}

/// One task in full: `tasq tasks show`.
pub fn detail(d: &TaskDetail, json_out: bool) -> String {
    let related = |list: &[tasq::console::Related]| -> Vec<Value> {
        list.iter()
            .map(|r| {
                json!({
                    "id": format!("{}:{}", r.id.pool(), r.id.seq()),
                    "type": r.task.as_ref().map(|(t, _)| t),
                    "state": r.task.as_ref().map(|(_, s)| state_name(*s)),
                })
            })
            .collect()
    };
    if json_out {
        let mut value = row_json(&d.row);
        let extra = json!({
            "payload": d.payload.as_deref().map(json_value),
            "output": d.output.as_deref().map(json_value),
            "lease_id": d.lease_id,
            "lease_until": d.lease_until.map(time),
            "failure_reason": d.failure_reason,
            "cancel_reason": d.cancel_reason,
            "cancel_requested": d.cancel_requested,
            "resubmitted_as": d.resubmitted_as.map(|id| format!("{}:{}", id.pool(), id.seq())),
            "dependencies": related(&d.dependencies),
            "dependents": related(&d.dependents),
            "timeline": d.timeline.iter()
                .map(|m| json!({"at": time(m.at), "what": m.what})).collect::<Vec<_>>(),
        });
        if let (Value::Object(map), Value::Object(more)) = (&mut value, extra) {
            map.extend(more);
        }
        return value.to_string();
    }
    let r = &d.row;
    let mut out = String::new();
    let mut line = |label: &str, value: String| out += &format!("{label:>15}  {value}\n");
    line(
        "id",
        format!("{} ({}:{})", short(r.id), r.id.pool(), r.id.seq()),
    );
    line("type", safe(&r.task_type, 200));
    line("queue", safe(&r.queue, 63));
    line(
        "state",
        format!(
            "{}{}",
            state_name(r.state),
            if r.dead { " (dead letter)" } else { "" }
        ),
    );
    line("priority", r.priority.to_string());
    line("attempts", format!("{} of {}", r.attempts, r.max_attempts));
    if let Some(key) = &r.key {
        line("key", safe(key, 200));
    }
    match &d.payload {
        Some(payload) => line("payload", safe(payload, 2_000)),
        None => line("payload", "kept by the pool as a Rust value".to_owned()),
    }
    if let Some(output) = &d.output {
        line("output", safe(output, 2_000));
    }
    if let Some(error) = &r.last_error {
        line("last error", safe(error, 2_000));
    }
    if let Some(reason) = &d.failure_reason {
        line("failed for", reason.clone());
    }
    if let Some(reason) = &d.cancel_reason {
        line("cancelled for", reason.clone());
    }
    if let Some(asked) = &d.cancel_requested {
        line("cancel asked", asked.clone());
    }
    if let (Some(lease), Some(until)) = (d.lease_id, d.lease_until) {
        line("lease", format!("{lease} until {}", time(until)));
    }
    if let Some(new) = d.resubmitted_as {
        line("retried as", short(new));
    }
    let list = |list: &[tasq::console::Related]| -> String {
        list.iter()
            .map(|r| match &r.task {
                Some((t, s)) => format!("{} ({} {})", short(r.id), safe(t, 40), state_name(*s)),
                None => format!("{} (gone)", short(r.id)),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !d.dependencies.is_empty() {
        line("waits for", list(&d.dependencies));
    }
    if !d.dependents.is_empty() {
        line("waited for by", list(&d.dependents));
    }
    for m in &d.timeline {
        line(m.what, time(m.at));
    }
    out
}

/// What a bulk retry or purge did, or would do.
pub fn bulk(what: &str, outcome: &BulkOutcome, dry_run: bool, json_out: bool) -> String {
    let id = |id: &TaskId| format!("{}:{}", id.pool(), id.seq());
    if json_out {
        return json!({
            "dry_run": dry_run,
            "matched": outcome.matched.iter().map(id).collect::<Vec<_>>(),
            "done": outcome.done.iter()
                .map(|(old, new)| json!({"id": id(old), "new": new.as_ref().map(id)}))
                .collect::<Vec<_>>(),
            "refused": outcome.refused.iter()
                .map(|(old, why)| json!({"id": id(old), "why": why}))
                .collect::<Vec<_>>(),
        })
        .to_string();
    }
    if dry_run {
        let ids: Vec<String> = outcome.matched.iter().map(|i| short(*i)).collect();
        return format!(
            "would {what} {} dead letters: {}\n",
            outcome.matched.len(),
            ids.join(" ")
        );
    }
    let mut out = format!(
        "{what}: {} of {} dead letters\n",
        outcome.done.len(),
        outcome.matched.len()
    );
    for (old, new) in &outcome.done {
        match new {
            Some(new) => out += &format!("  {} -> {}\n", short(*old), short(*new)),
            None => out += &format!("  {}\n", short(*old)),
        }
    }
    for (old, why) in &outcome.refused {
        out += &format!("  {} left: {}\n", short(*old), safe(why, 200));
    }
    out
}

/// A cancel's outcome.
pub fn cancelled(id: TaskId, outcome: CancelOutcome, json_out: bool) -> String {
    let (word, state) = match outcome {
        CancelOutcome::Cancelled => ("cancelled", None),
        CancelOutcome::Signalled => ("signalled", None),
        CancelOutcome::AlreadyFinished(state) => ("already finished", Some(state_name(state))),
        _ => ("unknown", None),
    };
    if json_out {
        return json!({"id": format!("{}:{}", id.pool(), id.seq()), "outcome": word, "state": state})
            .to_string();
    }
    match outcome {
        CancelOutcome::Cancelled => format!("{}: cancelled\n", short(id)),
        CancelOutcome::Signalled => format!("{}: running; asked to stop\n", short(id)),
        _ => format!(
            "{}: already {}\n",
            short(id),
            state.as_deref().unwrap_or("finished")
        ),
    }
}

/// The fleet's queue limits.
pub fn limits(limits: &[QueueLimit], json_out: bool) -> String {
    if json_out {
        return Value::Array(
            limits
                .iter()
                .map(|l| json!({"queue": l.queue, "max_running": l.max_running}))
                .collect(),
        )
        .to_string();
    }
    if limits.is_empty() {
        return "no queue is limited\n".to_owned();
    }
    let mut t = table(&["queue", "at most running"]);
    for l in limits {
        t.add_row([safe(&l.queue, 63), l.max_running.to_string()]);
    }
    format!("{t}\n")
}

/// The periodic tasks.
pub fn schedules(list: &[ScheduleInfo], json_out: bool) -> String {
    if json_out {
        return Value::Array(
            list.iter()
                .map(|s| {
                    json!({
                        "name": s.name, "definition": s.definition,
                        "next_slot": s.next_slot.map(time), "last_slot": s.last_slot.map(time),
                        "last_task": s.last_task.map(|id| format!("{}:{}", id.pool(), id.seq())),
                        "last_state": s.last_state.map(state_name),
                        "last_error": s.last_error, "paused": s.paused,
                    })
                })
                .collect(),
        )
        .to_string();
    }
    if list.is_empty() {
        return "no periodic tasks\n".to_owned();
    }
    let mut t = table(&["schedule", "when", "next", "last", "last task", "paused"]);
    for s in list {
        t.add_row([
            safe(&s.name, 40),
            safe(&s.definition, 60),
            s.next_slot.map_or("-".to_owned(), time),
            s.last_slot.map_or("-".to_owned(), time),
            match (s.last_task, s.last_state) {
                (Some(id), Some(state)) => format!("{} {}", short(id), state_name(state)),
                (Some(id), None) => short(id),
                _ => s
                    .last_error
                    .as_deref()
                    .map_or("-".to_owned(), |e| safe(e, 40)),
            },
            if s.paused {
                "paused".to_owned()
            } else {
                String::new()
            },
        ]);
    }
    format!("{t}\n")
}

/// JSON text a store gave, as a value (a string, if it does not parse).
fn json_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}
