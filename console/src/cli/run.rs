//! Each subcommand, run against the queue: what it reads or changes, and what it prints.

use std::io::Write;

use serde_json::json;
use tasq::console::{DeadFilter, TaskQuery};
use tasq::postgres::Admin;
use tasq::{PauseTarget, TaskId};

use super::args::{
    BulkArgs, CancelArgs, Cli, Command, DeadCommand, LimitArgs, Target, TasksCommand, WatchArgs,
};
use super::failure::{Failure, Kind};
use super::render;

/// Runs the command line `cli`, printing to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<(), Failure> {
    let url = cli.url.clone().ok_or_else(|| {
        Failure::new(
            Kind::Usage,
            "no database given: pass --url or set TASQ_DATABASE_URL",
        )
    })?;
    let json_out = cli.json;
    let print = |out: &mut dyn Write, text: String| -> Result<(), Failure> {
        let text = if json_out { text + "\n" } else { text };
        out.write_all(text.as_bytes())
            .map_err(|e| Failure::new(Kind::Db, format!("could not write the output: {e}")))
    };
    if let Command::Migrate = cli.command {
        let found = match &cli.schema {
            Some(schema) => tasq::postgres::migrate_in(&url, schema).map_err(|e| e.to_string()),
            None => tasq::postgres::migrate(&url).map_err(|e| e.to_string()),
        }
        .map_err(|e| Failure::new(Kind::Unreachable, format!("could not migrate: {e}")))?;
        let now = tasq::postgres::SCHEMA_VERSION;
        let text = if json_out {
            json!({"from": found, "to": now}).to_string()
        } else if found == now {
            format!("the queue's tables are at version {now}: nothing to do\n")
        } else {
            format!("migrated the queue's tables from version {found} to {now}\n")
        };
        return print(out, text);
    }
    let admin = match &cli.schema {
        Some(schema) => Admin::connect_in(&url, schema)?,
        None => Admin::connect(&url)?,
    };
    match cli.command {
        Command::Migrate => unreachable!("handled above"),
        Command::Stats => print(out, render::overview(&admin.overview()?, json_out)),
        Command::Tasks(TasksCommand::List(args)) => {
            let mut query = TaskQuery::new().limit(args.limit);
            if let Some(state) = args.state {
                query = query.state(state.into());
            }
            if let Some(name) = args.task_type {
                query = query.task_type(name);
            }
            if let Some(name) = args.queue {
                query = query.queue(name);
            }
            if let Some(key) = args.key {
                query = query.key(key);
            }
            if let Some(after) = args.after {
                query = query.after(parse_id(&admin, &after)?);
            }
            print(out, render::page(&admin.tasks(&query)?, json_out))
        }
        Command::Tasks(TasksCommand::Show(arg)) | Command::Dead(DeadCommand::Show(arg)) => {
            let id = parse_id(&admin, &arg.id)?;
            let task = admin.task(id)?.ok_or_else(|| unknown(id))?;
            print(out, render::detail(&task, json_out))
        }
        Command::Dead(DeadCommand::List(args)) => {
            let mut query = TaskQuery::new().dead().limit(args.limit);
            if let Some(name) = args.task_type {
                query = query.task_type(name);
            }
            if let Some(name) = args.queue {
                query = query.queue(name);
            }
            if let Some(after) = args.after {
                query = query.after(parse_id(&admin, &after)?);
            }
            print(out, render::page(&admin.tasks(&query)?, json_out))
        }
        Command::Dead(DeadCommand::Retry(args)) => {
            let text = bulk(&admin, &args, "retry", json_out)?;
            print(out, text)
        }
        Command::Dead(DeadCommand::Purge(args)) => {
            let text = bulk(&admin, &args, "purge", json_out)?;
            print(out, text)
        }
        Command::Cancel(args) => print(out, cancel(&admin, args, json_out)?),
        Command::Pause(target) => {
            let target = pause_target(target);
            let changed = admin.pause(&target)?;
            print(out, toggled(&target, "paused", changed, json_out))
        }
        Command::Resume(target) => {
            let target = pause_target(target);
            let changed = admin.resume(&target)?;
            print(out, toggled(&target, "resumed", changed, json_out))
        }
        Command::Limit(args) => print(out, limit(&admin, args, json_out)?),
        Command::Schedules => print(out, render::schedules(&admin.schedules()?, json_out)),
        Command::Watch(args) => watch(&admin, &args, json_out, out),
        Command::Web(args) => web(admin, args, out),
    }
}

/// A task id as given: its number in this queue (`42`), or `<queue id>:<number>`.
fn parse_id(admin: &Admin, text: &str) -> Result<TaskId, Failure> {
    let text = text.trim();
    if let Ok(seq) = text.parse::<u64>() {
        return Ok(admin.task_id(seq));
    }
    text.parse::<TaskId>().map_err(|_| {
        Failure::new(
            Kind::Usage,
            format!("{text:?} is not a task id: give its number (42) or its whole id (8412:42)"),
        )
    })
}

fn unknown(id: TaskId) -> Failure {
    Failure::new(
        Kind::NotFound,
        format!("no task {} in this queue", render::short(id)),
    )
}

/// `tasq dead retry|purge`: one dead letter, or every one the filters keep.
fn bulk(admin: &Admin, args: &BulkArgs, what: &str, json_out: bool) -> Result<String, Failure> {
    let retry = what == "retry";
    if let Some(id) = &args.id {
        let id = parse_id(admin, id)?;
        let task = admin.task(id)?.ok_or_else(|| unknown(id))?;
        if !task.row.dead {
            let state = render::state_name(task.row.state);
            return Err(Failure::new(
                Kind::Refused,
                format!("{} is not a dead letter (it is {state})", render::short(id)),
            ));
        }
        if args.dry_run {
            let outcome = tasq::console::BulkOutcome::default();
            let mut outcome = outcome;
            outcome.matched.push(id);
            return Ok(render::bulk(what, &outcome, true, json_out));
        }
        let new = if retry {
            Some(admin.retry(id)?.id)
        } else if admin.purge(id)? {
            None
        } else {
            return Err(Failure::new(
                Kind::Refused,
                format!("{} is not a dead letter any more", render::short(id)),
            ));
        };
        let mut outcome = tasq::console::BulkOutcome::default();
        outcome.matched.push(id);
        outcome.done.push((id, new));
        return Ok(render::bulk(what, &outcome, false, json_out));
    }
    let mut filter = DeadFilter::new();
    if let Some(name) = &args.task_type {
        filter = filter.task_type(name.clone());
    }
    if let Some(name) = &args.queue {
        filter = filter.queue(name.clone());
    }
    if let Some(text) = &args.error {
        filter = filter.error_contains(text.clone());
    }
    let outcome = if retry {
        admin.retry_dead(&filter, args.dry_run)?
    } else {
        admin.purge_dead(&filter, args.dry_run)?
    };
    Ok(render::bulk(what, &outcome, args.dry_run, json_out))
}

fn cancel(admin: &Admin, args: CancelArgs, json_out: bool) -> Result<String, Failure> {
    let (id, outcome) = match (args.id, args.key) {
        (Some(id), _) => {
            let id = parse_id(admin, &id)?;
            (id, admin.cancel(id)?)
        }
        (None, Some(key)) => admin.cancel_key(&key)?,
        (None, None) => unreachable!("clap requires an id or a key"),
    };
    Ok(render::cancelled(id, outcome, json_out))
}

fn pause_target(target: Target) -> PauseTarget {
    match (target.queue, target.task_type, target.schedule) {
        (Some(queue), _, _) => PauseTarget::queue(queue),
        (None, Some(name), _) => PauseTarget::task_type(name),
        (None, None, Some(name)) => PauseTarget::schedule(name),
        (None, None, None) => unreachable!("clap requires one target"),
    }
}

fn toggled(target: &PauseTarget, done: &str, changed: bool, json_out: bool) -> String {
    if json_out {
        return json!({"target": render::target_name(target), "changed": changed}).to_string();
    }
    let name = render::target_name(target);
    if changed {
        format!("{name}: {done} for the fleet\n")
    } else {
        format!("{name}: already {done}\n")
    }
}

fn limit(admin: &Admin, args: LimitArgs, json_out: bool) -> Result<String, Failure> {
    let Some(queue) = args.queue else {
        return Ok(render::limits(&admin.queue_limits()?, json_out));
    };
    let Some(text) = args.limit else {
        let limits = admin.queue_limits()?;
        let mine: Vec<_> = limits.into_iter().filter(|l| l.queue == queue).collect();
        return Ok(render::limits(&mine, json_out));
    };
    let limit = match text.as_str() {
        "none" => None,
        n => Some(n.parse::<u32>().map_err(|_| {
            Failure::new(
                Kind::Usage,
                format!("{n:?} is not a limit: give a number of tasks, or none"),
            )
        })?),
    };
    let before = admin.set_queue_limit(&queue, limit)?;
    if json_out {
        return Ok(json!({"queue": queue, "limit": limit, "before": before}).to_string());
    }
    let show = |l: Option<u32>| l.map_or("none".to_owned(), |n| n.to_string());
    Ok(format!(
        "queue {}: limit {} (was {})\n",
        render::safe(&queue, 63),
        show(limit),
        show(before)
    ))
}

/// `tasq web`: the dashboard, until the process is stopped.
fn web(admin: Admin, args: super::args::WebArgs, out: &mut dyn Write) -> Result<(), Failure> {
    let mut dashboard = tasq_console::web::Dashboard::new(admin)
        .bind(args.bind)
        .read_only(args.read_only)
        .sample_every(args.sample_every);
    if let Some(token) = &args.token {
        dashboard = dashboard.token(token.clone());
    }
    let running = dashboard
        .start()
        .map_err(|e| Failure::new(Kind::Usage, e.to_string()))?;
    let mode = if args.read_only { " (read-only)" } else { "" };
    let line = match &args.token {
        Some(_) => format!(
            "serving the dashboard{mode} at http://{}/ (open it once with ?token=<your token>)\n",
            running.addr()
        ),
        None => format!(
            "serving the dashboard{mode} at http://{}/\n",
            running.addr()
        ),
    };
    out.write_all(line.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| Failure::new(Kind::Db, format!("could not write the output: {e}")))?;
    running.wait();
    Ok(())
}

/// `tasq watch`: the figures, redrawn every interval (a frame a line of JSON with `--json`).
fn watch(
    admin: &Admin,
    args: &WatchArgs,
    json_out: bool,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let mut frame = 0;
    loop {
        let overview = admin.overview()?;
        let text = render::overview(&overview, json_out);
        let text = if json_out {
            text + "\n"
        } else {
            // Clear the screen and go home, as `top` does.
            format!("\x1b[2J\x1b[H{text}")
        };
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| Failure::new(Kind::Db, format!("could not write the output: {e}")))?;
        frame += 1;
        if args.count.is_some_and(|count| frame >= count) {
            return Ok(());
        }
        std::thread::sleep(args.interval);
    }
}
