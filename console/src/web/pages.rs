//! The dashboard's pages, as HTML written on the server with `maud`, which escapes every value
//! it writes: a payload, an error, a key or a type name is text on the page, never markup. The
//! pages hold no script: they work in any browser, and the server forbids scripts besides
//! (`Content-Security-Policy`).

use maud::{DOCTYPE, Markup, html};
use tasq::console::{BulkOutcome, Overview, Related, TaskDetail, TaskPage, TaskRow};
use tasq::{BreakerState, PauseTarget, ScheduleInfo, TaskId, TaskState};

use super::history::History;
use super::plot;

/// What every page needs to know of the request: the CSRF token for its forms (`None` in
/// read-only mode: no forms at all) and a message from the action just done.
pub struct Ctx<'a> {
    /// The token every form carries, or `None` when the dashboard is read-only.
    pub csrf: Option<&'a str>,
    /// What the last action did, to show once.
    pub flash: Option<&'a str>,
    /// Seconds between reloads of the overview, if it reloads.
    pub refresh: Option<u64>,
}

fn time(at: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

fn age(d: Option<std::time::Duration>) -> String {
    d.map_or("-".to_owned(), |d| {
        let rounded = std::time::Duration::from_millis(d.as_millis() as u64 / 100 * 100);
        humantime::format_duration(rounded).to_string()
    })
}

/// Tasks a second, or a minute when fewer than one a second.
fn rate(per_second: f64) -> String {
    if per_second >= 1.0 {
        format!("{per_second:.1}/s")
    } else {
        format!("{:.1}/min", per_second * 60.0)
    }
}

fn state_of(state: TaskState, dead: bool) -> String {
    if dead {
        "dead".to_owned()
    } else {
        state.to_string()
    }
}

/// A link with a query string built from `pairs` (values encoded, then escaped by maud).
pub fn link(path: &str, pairs: &[(&str, &str)]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        if !v.is_empty() {
            query.append_pair(k, v);
        }
    }
    let query = query.finish();
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query}")
    }
}

/// A button that POSTs `fields` to `action` with the CSRF token; nothing when read-only.
fn button(ctx: &Ctx, action: &str, fields: &[(&str, &str)], label: &str, class: &str) -> Markup {
    let Some(csrf) = ctx.csrf else {
        return html! {};
    };
    html! {
        form method="post" action=(action) class="inline" {
            input type="hidden" name="csrf" value=(csrf);
            @for (name, value) in fields {
                input type="hidden" name=(name) value=(value);
            }
            button type="submit" class=(class) { (label) }
        }
    }
}

fn pause_button(ctx: &Ctx, kind: &str, name: &str, paused: bool) -> Markup {
    if paused {
        button(
            ctx,
            "/resume",
            &[("kind", kind), ("name", name)],
            "Resume",
            "resume",
        )
    } else {
        button(
            ctx,
            "/pause",
            &[("kind", kind), ("name", name)],
            "Pause",
            "pause",
        )
    }
}

/// The frame of every page: the menu, the search box, the message of the last action.
pub fn layout(title: &str, ctx: &Ctx, refresh: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                @if let (true, Some(every)) = (refresh, ctx.refresh) {
                    meta http-equiv="refresh" content=(every);
                }
                title { "tasq · " (title) }
                link rel="stylesheet" href="/style.css";
            }
            body {
                nav {
                    a href="/" { "Overview" }
                    a href="/tasks" { "Tasks" }
                    a href="/dead" { "Dead letters" }
                    a href="/schedules" { "Schedules" }
                    form method="get" action="/find" class="search" {
                        input type="search" name="q" placeholder="task id or key" aria-label="task id or key";
                        button type="submit" { "Find" }
                    }
                    @if ctx.csrf.is_none() {
                        span class="readonly" { "read-only" }
                    }
                }
                main {
                    h1 { (title) }
                    @if let Some(flash) = ctx.flash {
                        p class="flash" id="flash" { (flash) }
                    }
                    (body)
                }
            }
        }
    }
}

/// `/`: the figures, the plots, the queues and types with their pause buttons, the breakers.
pub fn overview(o: &Overview, history: &History, ctx: &Ctx) -> Markup {
    let s = &o.states;
    let whole = history.series("");
    let minutes: Vec<(usize, usize)> = o.minutes.iter().map(|m| (m.succeeded, m.failed)).collect();
    let open_breakers: Vec<_> = o
        .breakers
        .iter()
        .filter(|b| b.state != BreakerState::Closed)
        .collect();
    let body = html! {
        p class="at" { "At " (time(o.at)) @if o.estimated { " · figures marked ~ are floors or estimates past 10,000" } }
        table id="states" class="figures" {
            tr { th { "blocked" } th { "scheduled" } th { "ready" } th { "running" } th { "succeeded" } th { "failed" } th { "dead" } th { "cancelled" } }
            tr {
                td id="n-blocked" { (s.blocked) } td id="n-scheduled" { (s.scheduled) }
                td id="n-ready" { (s.ready) } td id="n-running" { (s.running) }
                td id="n-succeeded" { (s.succeeded) } td id="n-failed" { (s.failed) }
                td id="n-dead" { (s.dead) } td id="n-cancelled" { (s.cancelled) }
            }
        }
        p { "Oldest ready: " span id="oldest-ready" { (age(o.oldest_ready)) } " · throughput " (rate(o.throughput)) }
        @if !open_breakers.is_empty() || o.oldest_ready.is_some_and(|a| a.as_secs() >= 60) {
            section class="alerts" id="alerts" {
                h2 { "Alerts" }
                ul {
                    @for b in &open_breakers {
                        li { "Breaker " (b.downstream) " is " (format!("{:?}", b.state).to_lowercase()) " after " (b.consecutive_failures) " failures" }
                    }
                    @if let Some(a) = o.oldest_ready.filter(|a| a.as_secs() >= 60) {
                        li { "A ready task has waited " (age(Some(a))) }
                    }
                }
            }
        }
        section class="plots" {
            div { h2 { "Ready tasks" } (plot::line(&whole.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>(), "ready")) }
            div { h2 { "Oldest ready (s)" } (plot::line(&whole.iter().map(|p| (p.0, p.2)).collect::<Vec<_>>(), "seconds")) }
            div { h2 { "Finished a minute" } (plot::bars(&minutes, "succeeded / failed")) }
        }
        h2 { "Queues" }
        table id="queues" {
            tr { th { "queue" } th { "ready" } th { "running" } th { "oldest ready" } th { "limit" } th { "depth" } th {} }
            @for q in &o.queues {
                tr data-queue=(q.name) {
                    td { a href=(link("/tasks", &[("queue", &q.name)])) { (q.name) } @if q.paused { " " span class="paused" { "paused" } } }
                    td class="ready" { (q.ready) }
                    td { (q.running) }
                    td { (age(q.oldest_ready)) }
                    td { (q.limit.map_or("-".to_owned(), |n| n.to_string())) }
                    td { (plot::line_sized(&history.series(&q.name).iter().map(|p| (p.0, p.1)).collect::<Vec<_>>(), "ready", 160.0, 36.0)) }
                    td { (pause_button(ctx, "queue", &q.name, q.paused)) }
                }
            }
        }
        h2 { "Types" }
        table id="types" {
            tr { th { "type" } th { "ready" } th { "running" } th { "dead" } th { "oldest ready" } th {} }
            @for t in &o.types {
                tr data-type=(t.name) {
                    td { a href=(link("/tasks", &[("type", &t.name)])) { (t.name) } @if t.paused { " " span class="paused" { "paused" } } }
                    td { (t.ready) }
                    td { (t.running) }
                    td { a href=(link("/dead", &[("type", &t.name)])) { (t.dead) } }
                    td { (age(t.oldest_ready)) }
                    td { (pause_button(ctx, "type", &t.name, t.paused)) }
                }
            }
        }
        @if !o.breakers.is_empty() {
            h2 { "Breakers" }
            table id="breakers" {
                tr { th { "downstream" } th { "state" } th { "failures in a row" } th { "opened" } }
                @for b in &o.breakers {
                    tr { td { (b.downstream) } td { (format!("{:?}", b.state).to_lowercase()) } td { (b.consecutive_failures) } td { (b.opened_at.map_or("-".to_owned(), time)) } }
                }
            }
        }
    };
    layout("Overview", ctx, true, body)
}

fn rows(page: &TaskPage, ctx: &Ctx, dead: bool) -> Markup {
    html! {
        table id="tasks" {
            tr { th { "id" } th { "type" } th { "queue" } th { "state" } th { "priority" } th { "attempts" } th { "key" } th { "last error" } @if dead && ctx.csrf.is_some() { th {} } }
            @for t in &page.tasks {
                (row(t, ctx, dead))
            }
        }
    }
}

fn row(t: &TaskRow, ctx: &Ctx, dead: bool) -> Markup {
    let seq = t.id.seq().to_string();
    html! {
        tr data-id=(seq) {
            td { a href={"/tasks/" (seq)} { (seq) } }
            td class="type" { (t.task_type) }
            td { (t.queue) }
            td class="state" { (state_of(t.state, t.dead)) }
            td { (t.priority) }
            td { (t.attempts) "/" (t.max_attempts) }
            td class="key" { (t.key.as_deref().unwrap_or("")) }
            td class="error" { (t.last_error.as_deref().map(|e| shorten(e, 120)).unwrap_or_default()) }
            @if dead && ctx.csrf.is_some() {
                td {
                    (button(ctx, &format!("/tasks/{seq}/retry"), &[], "Retry", "retry"))
                    (button(ctx, &format!("/tasks/{seq}/purge"), &[], "Purge", "purge"))
                }
            }
        }
    }
}

fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// The filters a list page was asked for, to keep in its links.
#[derive(Debug, Default)]
pub struct Filters {
    /// `state`
    pub state: String,
    /// `type`
    pub task_type: String,
    /// `queue`
    pub queue: String,
    /// `key`
    pub key: String,
}

impl Filters {
    fn pairs<'a>(&'a self, after: &'a str) -> Vec<(&'a str, &'a str)> {
        vec![
            ("state", self.state.as_str()),
            ("type", self.task_type.as_str()),
            ("queue", self.queue.as_str()),
            ("key", self.key.as_str()),
            ("after", after),
        ]
    }
}

fn next_link(path: &str, filters: &Filters, next: Option<TaskId>) -> Markup {
    html! {
        @if let Some(next) = next {
            @let after = next.seq().to_string();
            p { a id="next" href=(link(path, &filters.pairs(&after))) { "Next page →" } }
        } @else {
            p class="end" { "No more." }
        }
    }
}

/// `/tasks`: a page of tasks, with the filters as a form.
pub fn tasks(page: &TaskPage, filters: &Filters, ctx: &Ctx) -> Markup {
    const STATES: [&str; 7] = [
        "blocked",
        "scheduled",
        "ready",
        "running",
        "succeeded",
        "failed",
        "cancelled",
    ];
    let body = html! {
        form method="get" action="/tasks" class="filters" {
            select name="state" aria-label="state" {
                option value="" { "any state" }
                @for s in STATES {
                    option value=(s) selected[filters.state == s] { (s) }
                }
            }
            input name="type" placeholder="type" value=(filters.task_type) aria-label="type";
            input name="queue" placeholder="queue" value=(filters.queue) aria-label="queue";
            input name="key" placeholder="key" value=(filters.key) aria-label="key";
            button type="submit" { "Filter" }
        }
        (rows(page, ctx, false))
        (next_link("/tasks", filters, page.next))
    };
    layout("Tasks", ctx, false, body)
}

/// `/dead`: a page of dead letters with their buttons, and the bulk form.
pub fn dead(page: &TaskPage, filters: &Filters, ctx: &Ctx) -> Markup {
    let body = html! {
        form method="get" action="/dead" class="filters" {
            input name="type" placeholder="type" value=(filters.task_type) aria-label="type";
            input name="queue" placeholder="queue" value=(filters.queue) aria-label="queue";
            button type="submit" { "Filter" }
        }
        @if let Some(csrf) = ctx.csrf {
            form method="post" action="/dead/bulk" class="bulk" id="bulk" {
                input type="hidden" name="csrf" value=(csrf);
                input name="type" placeholder="type" value=(filters.task_type) aria-label="bulk type";
                input name="queue" placeholder="queue" value=(filters.queue) aria-label="bulk queue";
                input name="error" placeholder="error contains" aria-label="error contains";
                label { input type="checkbox" name="dry_run" value="1" checked; " dry run" }
                button type="submit" name="action" value="retry" class="retry" { "Retry all matching" }
                button type="submit" name="action" value="purge" class="purge" { "Purge all matching" }
            }
        }
        (rows(page, ctx, true))
        (next_link("/dead", filters, page.next))
    };
    layout("Dead letters", ctx, false, body)
}

fn related(list: &[Related]) -> Markup {
    html! {
        ul {
            @for r in list {
                li {
                    a href={"/tasks/" (r.id.seq())} { (r.id.seq()) }
                    @match &r.task {
                        Some((t, s)) => { " " (t) " · " (s.to_string()) }
                        None => { " (gone)" }
                    }
                }
            }
        }
    }
}

/// `/tasks/<n>`: one task in full, with the buttons its state allows.
pub fn task(d: &TaskDetail, ctx: &Ctx) -> Markup {
    let r = &d.row;
    let seq = r.id.seq().to_string();
    let body = html! {
        dl id="task" {
            dt { "id" } dd { (seq) " (" (r.id.pool()) ":" (r.id.seq()) ")" }
            dt { "type" } dd id="type" { (r.task_type) }
            dt { "queue" } dd { (r.queue) }
            dt { "state" } dd id="state" { (state_of(r.state, r.dead)) }
            dt { "priority" } dd { (r.priority) }
            dt { "attempts" } dd { (r.attempts) " of " (r.max_attempts) }
            @if let Some(key) = &r.key { dt { "key" } dd id="key" { (key) } }
            dt { "payload" } dd { pre id="payload" { (d.payload.as_deref().map_or_else(|| "kept by the pool as a Rust value".to_owned(), pretty)) } }
            @if let Some(output) = &d.output { dt { "output" } dd { pre id="output" { (pretty(output)) } } }
            @if let Some(error) = &r.last_error { dt { "last error" } dd { pre id="error" { (error) } } }
            @if let Some(reason) = &d.failure_reason { dt { "failed for" } dd { (reason) } }
            @if let Some(reason) = &d.cancel_reason { dt { "cancelled for" } dd { (reason) } }
            @if let (Some(lease), Some(until)) = (d.lease_id, d.lease_until) { dt { "lease" } dd { (lease) " until " (time(until)) } }
            @if let Some(new) = d.resubmitted_as { dt { "retried as" } dd { a id="retried-as" href={"/tasks/" (new.seq())} { (new.seq()) } } }
        }
        @if !d.dependencies.is_empty() { h2 { "Waits for" } (related(&d.dependencies)) }
        @if !d.dependents.is_empty() { h2 { "Waited for by" } (related(&d.dependents)) }
        h2 { "Timeline" }
        ol id="timeline" {
            @for m in &d.timeline { li { (time(m.at)) " " (m.what) } }
        }
        div class="actions" {
            @if r.dead {
                (button(ctx, &format!("/tasks/{seq}/retry"), &[], "Retry", "retry"))
                (button(ctx, &format!("/tasks/{seq}/purge"), &[], "Purge", "purge"))
            }
            @if !r.state.is_terminal() {
                (button(ctx, &format!("/tasks/{seq}/cancel"), &[], "Cancel", "cancel"))
            }
        }
    };
    layout(&format!("Task {seq}"), ctx, false, body)
}

/// `/schedules`: the periodic tasks, with pause buttons.
pub fn schedules(list: &[ScheduleInfo], ctx: &Ctx) -> Markup {
    let body = html! {
        @if list.is_empty() {
            p { "No periodic tasks." }
        } @else {
            table id="schedules" {
                tr { th { "schedule" } th { "when" } th { "next" } th { "last" } th { "last task" } th {} }
                @for s in list {
                    tr {
                        td { (s.name) @if s.paused { " " span class="paused" { "paused" } } }
                        td { (s.definition) }
                        td { (s.next_slot.map_or("-".to_owned(), time)) }
                        td { (s.last_slot.map_or("-".to_owned(), time)) }
                        td {
                            @if let Some(id) = s.last_task {
                                a href={"/tasks/" (id.seq())} { (id.seq()) }
                                @if let Some(state) = s.last_state { " " (state.to_string()) }
                            } @else if let Some(error) = &s.last_error {
                                (error)
                            }
                        }
                        td { (pause_button(ctx, "schedule", &s.name, s.paused)) }
                    }
                }
            }
        }
    };
    layout("Schedules", ctx, false, body)
}

/// What a bulk action did, or would do.
pub fn bulk(what: &str, outcome: &BulkOutcome, dry_run: bool, ctx: &Ctx) -> Markup {
    let body = html! {
        @if dry_run {
            p id="summary" { "Would " (what) " " (outcome.matched.len()) " dead letters (dry run: nothing changed)." }
        } @else {
            p id="summary" { (what) ": " (outcome.done.len()) " of " (outcome.matched.len()) " dead letters." }
        }
        ul {
            @for id in &outcome.matched { li { a href={"/tasks/" (id.seq())} { (id.seq()) } } }
        }
        @for (id, why) in &outcome.refused { p { (id.seq()) " left: " (why) } }
        p { a href="/dead" { "Back to the dead letters" } }
    };
    layout("Bulk action", ctx, false, body)
}

/// A page that says what went wrong.
pub fn problem(title: &str, message: &str, ctx: &Ctx) -> Markup {
    layout(
        title,
        ctx,
        false,
        html! { p class="problem" id="problem" { (message) } },
    )
}

/// The name of a pause target, for messages.
pub fn target_name(target: &PauseTarget) -> String {
    match target {
        PauseTarget::Queue(name) => format!("queue {name}"),
        PauseTarget::Type(name) => format!("type {name}"),
        PauseTarget::Schedule(name) => format!("schedule {name}"),
    }
}

/// The style sheet, served at `/style.css`.
pub const STYLE: &str = "
body { font-family: system-ui, sans-serif; margin: 0; color: #1d2430; background: #f6f7f9; }
nav { background: #1d2430; padding: .6em 1em; display: flex; gap: 1.2em; align-items: center; }
nav a { color: #fff; text-decoration: none; font-weight: 600; }
nav .search { margin-left: auto; }
nav .readonly { color: #f5c04a; font-weight: 600; }
main { padding: 1em 1.5em; }
h1 { margin-top: .2em; } h2 { font-size: 1.05em; margin: 1.2em 0 .4em; }
table { border-collapse: collapse; background: #fff; margin-bottom: .8em; }
th, td { border: 1px solid #d8dce3; padding: .3em .6em; text-align: left; vertical-align: top; }
th { background: #eef0f4; font-weight: 600; }
td.error { max-width: 30em; overflow-wrap: anywhere; }
.figures td { font-size: 1.4em; text-align: right; }
.flash { background: #e6f4ea; border: 1px solid #9bd3ad; padding: .5em; }
.problem { background: #fdecea; border: 1px solid #f1a9a0; padding: .5em; }
.alerts { background: #fff4e5; border: 1px solid #f5c04a; padding: .2em 1em; }
.paused { background: #f5c04a; border-radius: 3px; padding: 0 .3em; font-size: .85em; }
.plots { display: flex; gap: 1.5em; flex-wrap: wrap; }
.plot .frame { fill: #fff; stroke: #d8dce3; }
.plot .series { fill: none; stroke: #2f6fdf; stroke-width: 1.5; }
.plot .ok { fill: #4caf7a; } .plot .failed { fill: #e05a47; }
.plot .label { font-size: 10px; fill: #556; }
form.inline { display: inline; }
button { cursor: pointer; }
button.purge, button.cancel { color: #a32; }
pre { margin: 0; white-space: pre-wrap; overflow-wrap: anywhere; max-width: 60em; }
dl { display: grid; grid-template-columns: max-content auto; gap: .3em 1em; background: #fff; padding: 1em; }
dt { font-weight: 600; }
.filters, .bulk { margin-bottom: .8em; }
";

/// JSON text laid out to read, or as it is if it does not parse.
fn pretty(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| text.to_owned())
}
