//! One request answered: who may ask (see `security.rs`), which page or action it names, and
//! the response with the headers every page carries.
//!
//! Routes: `GET /`, `/tasks`, `/tasks/<n>`, `/dead`, `/schedules`, `/find?q=`, `/style.css`;
//! `POST /tasks/<n>/retry|purge|cancel`, `/dead/bulk`, `/pause`, `/resume`.

use std::io::Read;

use maud::Markup;
use tasq::console::{DeadFilter, TaskQuery};
use tasq::{CancelOutcome, PauseTarget, TaskId, TaskState};
use tiny_http::{Header, Request, Response};

use super::pages::{self, Ctx, Filters};
use super::security;
use super::server::Shared;

/// The largest form body read.
const MAX_BODY: u64 = 64 * 1024;

/// What every response says besides its body: no script may run, no other site may frame it,
/// nothing is cached.
const HEADERS: [(&str, &str); 5] = [
    (
        "Content-Security-Policy",
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
         frame-ancestors 'none'; base-uri 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
];

fn header(name: &str, value: &str) -> Header {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("a valid header")
}

fn with_headers<R: Read>(mut response: Response<R>) -> Response<R> {
    for (name, value) in HEADERS {
        response.add_header(header(name, value));
    }
    response
}

fn html(status: u16, markup: Markup) -> Response<std::io::Cursor<Vec<u8>>> {
    with_headers(
        Response::from_string(markup.into_string())
            .with_status_code(status)
            .with_header(header("Content-Type", "text/html; charset=utf-8")),
    )
}

fn redirect(location: &str) -> Response<std::io::Cursor<Vec<u8>>> {
    with_headers(
        Response::from_string(String::new())
            .with_status_code(303)
            .with_header(header("Location", location)),
    )
}

/// Answers `request` (errors writing the answer are the client's: it went away).
pub(crate) fn answer(shared: &Shared, mut request: Request) {
    let response = respond(shared, &mut request);
    let _ = request.respond(response);
}

fn get_header<'a>(request: &'a Request, name: &'static str) -> Option<&'a str> {
    request
        .headers()
        .iter()
        .find(|h| h.field.equiv(name))
        .map(|h| h.value.as_str())
}

fn respond(shared: &Shared, request: &mut Request) -> Response<std::io::Cursor<Vec<u8>>> {
    let url = request.url().to_owned();
    let (path, query) = url.split_once('?').unwrap_or((url.as_str(), ""));
    let params: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let param = |name: &str| -> String {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let none = Ctx {
        csrf: None,
        flash: None,
        refresh: None,
    };
    // Who may ask.
    match &shared.token {
        Some(token) => {
            let query_token = params
                .iter()
                .find(|(k, _)| k == "token")
                .map(|(_, v)| v.as_str());
            let given = security::presented(
                get_header(request, "Authorization"),
                get_header(request, "Cookie"),
                query_token,
            );
            if !given.is_some_and(|given| security::same(given, token)) {
                return html(
                    401,
                    pages::problem(
                        "Access token required",
                        "This dashboard needs its access token: open it with ?token=<token>, or send Authorization: Bearer <token>.",
                        &none,
                    ),
                );
            }
            if query_token.is_some() {
                // Kept as a cookie, and taken out of the address (and so of the history).
                let mut response = redirect(path);
                response.add_header(header(
                    "Set-Cookie",
                    &format!("tasq_token={token}; HttpOnly; SameSite=Strict; Path=/"),
                ));
                return response;
            }
        }
        None => {
            if !security::host_allowed(get_header(request, "Host"), shared.bound) {
                return html(
                    421,
                    pages::problem(
                        "Wrong host",
                        "This dashboard answers only to its own address.",
                        &none,
                    ),
                );
            }
        }
    }
    let flash = param("done");
    let ctx = Ctx {
        csrf: (!shared.read_only).then_some(shared.csrf.as_str()),
        flash: (!flash.is_empty()).then_some(flash.as_str()),
        refresh: shared.refresh.map(|d| d.as_secs().max(1)),
    };
    let method = request.method().as_str().to_owned();
    if method == "POST" {
        return post(shared, request, path, &ctx);
    }
    if method != "GET" && method != "HEAD" {
        return html(
            405,
            pages::problem("Not allowed", "Use GET, or POST a form.", &ctx),
        );
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let source = &*shared.source;
    let filters = Filters {
        state: param("state"),
        task_type: param("type"),
        queue: param("queue"),
        key: param("key"),
    };
    let after = param("after");
    let failed = |e: String| html(503, pages::problem("The queue could not be read", &e, &ctx));
    match segments.as_slice() {
        [""] => match source.overview() {
            Ok(o) => html(200, pages::overview(&o, &shared.history, &ctx)),
            Err(e) => failed(e),
        },
        ["style.css"] => with_headers(
            Response::from_string(pages::STYLE)
                .with_header(header("Content-Type", "text/css; charset=utf-8")),
        ),
        ["tasks"] | ["dead"] => {
            let dead = segments[0] == "dead";
            let mut query = TaskQuery::new().limit(50);
            if dead {
                query = query.dead();
            } else if let Some(state) = state_named(&filters.state) {
                query = query.state(state);
            }
            if !filters.task_type.is_empty() {
                query = query.task_type(filters.task_type.clone());
            }
            if !filters.queue.is_empty() {
                query = query.queue(filters.queue.clone());
            }
            if !filters.key.is_empty() && !dead {
                query = query.key(filters.key.clone());
            }
            if let Ok(seq) = after.parse::<u64>() {
                query = query.after(source.task_id(seq));
            }
            match source.tasks(&query) {
                Ok(page) if dead => html(200, pages::dead(&page, &filters, &ctx)),
                Ok(page) => html(200, pages::tasks(&page, &filters, &ctx)),
                Err(e) => failed(e),
            }
        }
        ["tasks", n] => {
            let Some(id) = n.parse::<u64>().ok().map(|seq| source.task_id(seq)) else {
                return not_found(&ctx);
            };
            match source.task(id) {
                Ok(Some(detail)) => html(200, pages::task(&detail, &ctx)),
                Ok(None) => not_found(&ctx),
                Err(e) => failed(e),
            }
        }
        ["schedules"] => match source.schedules() {
            Ok(list) => html(200, pages::schedules(&list, &ctx)),
            Err(e) => failed(e),
        },
        ["find"] => {
            let q = param("q");
            let q = q.trim();
            if let Ok(seq) = q.parse::<u64>() {
                if let Ok(Some(_)) = source.task(source.task_id(seq)) {
                    return redirect(&format!("/tasks/{seq}"));
                }
            }
            redirect(&pages::link("/tasks", &[("key", q)]))
        }
        _ => not_found(&ctx),
    }
}

fn not_found(ctx: &Ctx) -> Response<std::io::Cursor<Vec<u8>>> {
    html(
        404,
        pages::problem("Not found", "No such page or task.", ctx),
    )
}

fn state_named(name: &str) -> Option<TaskState> {
    Some(match name {
        "blocked" => TaskState::Blocked,
        "scheduled" => TaskState::Scheduled,
        "ready" => TaskState::Ready,
        "running" => TaskState::Running,
        "succeeded" => TaskState::Succeeded,
        "failed" => TaskState::Failed,
        "cancelled" => TaskState::Cancelled,
        _ => return None,
    })
}

/// An action: refused in read-only mode and without this run's CSRF token; then done, and the
/// browser sent back to a page that says what was done.
fn post(
    shared: &Shared,
    request: &mut Request,
    path: &str,
    ctx: &Ctx,
) -> Response<std::io::Cursor<Vec<u8>>> {
    if shared.read_only {
        return html(
            403,
            pages::problem("Read-only", "This dashboard changes nothing.", ctx),
        );
    }
    let mut body = Vec::new();
    if request
        .as_reader()
        .take(MAX_BODY)
        .read_to_end(&mut body)
        .is_err()
    {
        return html(
            400,
            pages::problem("Bad request", "The form could not be read.", ctx),
        );
    }
    let form: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
    let field = |name: &str| -> String {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    if !security::same(&field("csrf"), &shared.csrf) {
        return html(
            403,
            pages::problem(
                "Refused",
                "This form did not come from this dashboard (its CSRF token is missing or wrong). Reload the page and try again.",
                ctx,
            ),
        );
    }
    let source = &*shared.source;
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let done = |location: &str, message: String| {
        let location = if location.contains('?') {
            format!(
                "{location}&{}",
                pages::link("", &[("done", &message)]).trim_start_matches('?')
            )
        } else {
            format!("{location}{}", pages::link("", &[("done", &message)]))
        };
        redirect(&location)
    };
    let problem = |e: String| html(409, pages::problem("Not done", &e, ctx));
    match segments.as_slice() {
        ["tasks", n, action] => {
            let Some(id) = n.parse::<u64>().ok().map(|seq| source.task_id(seq)) else {
                return not_found(ctx);
            };
            let page = format!("/tasks/{n}");
            match *action {
                "retry" => match source.retry(id) {
                    Ok(new) => done(&page, format!("Retried as task {}", new.seq())),
                    Err(e) => problem(e),
                },
                "purge" => match source.purge(id) {
                    Ok(true) => done(&page, format!("Purged task {n}")),
                    Ok(false) => problem(format!("Task {n} is not a dead letter")),
                    Err(e) => problem(e),
                },
                "cancel" => match source.cancel(id) {
                    Ok(outcome) => done(&page, cancel_message(id, outcome)),
                    Err(e) => problem(e),
                },
                _ => not_found(ctx),
            }
        }
        ["dead", "bulk"] => {
            let mut filter = DeadFilter::new();
            if !field("type").is_empty() {
                filter = filter.task_type(field("type"));
            }
            if !field("queue").is_empty() {
                filter = filter.queue(field("queue"));
            }
            if !field("error").is_empty() {
                filter = filter.error_contains(field("error"));
            }
            let dry_run = !field("dry_run").is_empty();
            let action = field("action");
            let outcome = match action.as_str() {
                "retry" => source.retry_dead(&filter, dry_run),
                "purge" => source.purge_dead(&filter, dry_run),
                _ => return not_found(ctx),
            };
            match outcome {
                Ok(outcome) => html(200, pages::bulk(&action, &outcome, dry_run, ctx)),
                Err(e) => problem(e),
            }
        }
        [verb @ ("pause" | "resume")] => {
            let name = field("name");
            let target = match field("kind").as_str() {
                "queue" => PauseTarget::queue(name),
                "type" => PauseTarget::task_type(name),
                "schedule" => PauseTarget::schedule(name),
                _ => return not_found(ctx),
            };
            let back = if matches!(target, PauseTarget::Schedule(_)) {
                "/schedules"
            } else {
                "/"
            };
            let result = if *verb == "pause" {
                source.pause(&target)
            } else {
                source.resume(&target)
            };
            match result {
                Ok(_) => done(
                    back,
                    format!(
                        "{}: {verb}d{}",
                        pages::target_name(&target),
                        source.pause_reach()
                    ),
                ),
                Err(e) => problem(e),
            }
        }
        _ => not_found(ctx),
    }
}

fn cancel_message(id: TaskId, outcome: CancelOutcome) -> String {
    match outcome {
        CancelOutcome::Cancelled => format!("Cancelled task {}", id.seq()),
        CancelOutcome::Signalled => format!("Task {} is running: asked to stop", id.seq()),
        CancelOutcome::AlreadyFinished(state) => {
            format!("Task {} had already finished ({state})", id.seq())
        }
        _ => format!("Task {}: cancel asked", id.seq()),
    }
}
