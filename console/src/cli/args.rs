//! The command line: what `tasq --help` shows.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// What `tasq --help` ends with: the environment and the exit codes.
const AFTER_HELP: &str = "\
Exit codes:
  0  done
  1  the database failed during the command
  2  bad usage or a bad argument (an unknown flag, a name a queue cannot have)
  3  not found: no task with that id or key
  4  refused: the task is not in a state the action takes (not a dead letter, already retried)
  5  cannot reach the queue: a wrong URL, the server down, a schema not migrated or of
     another version";

/// The operator's console of a tasq durable queue.
#[derive(Debug, Parser)]
#[command(name = "tasq", version, about, after_help = AFTER_HELP)]
pub struct Cli {
    /// The database, as a libpq connection string or URL.
    #[arg(long, env = "TASQ_DATABASE_URL", global = true, hide_env_values = true)]
    pub url: Option<String>,
    /// The schema that holds the queue (the connection's search_path if not given).
    #[arg(long, env = "TASQ_SCHEMA", global = true)]
    pub schema: Option<String>,
    /// Print JSON for scripts instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the queue's tables.
    Migrate,
    /// The queue's figures: by state, queue, type and priority; the oldest ready task's age;
    /// the last minutes' outcomes.
    Stats,
    /// List tasks, or show one.
    #[command(subcommand)]
    Tasks(TasksCommand),
    /// Dead letters: list, show, retry, purge.
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Cancel a task by id or key (one not started ends cancelled with its dependents; a
    /// running one is asked to stop).
    Cancel(CancelArgs),
    /// Pause a queue, a type or a schedule for the whole fleet.
    Pause(Target),
    /// Resume what was paused.
    Resume(Target),
    /// Set or lift a queue's limit on running tasks for the whole fleet (`none` lifts it).
    Limit(LimitArgs),
    /// The periodic tasks: next and last slot, last task and outcome.
    Schedules,
    /// A live view of the queue, redrawn every interval (like `top`).
    Watch(WatchArgs),
    /// Serve the dashboard (127.0.0.1:8080 unless --bind says otherwise).
    Web(WebArgs),
}

/// `tasq web`
#[derive(Debug, Args)]
pub struct WebArgs {
    /// Where to listen. Any address but a loopback one needs --token.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub bind: String,
    /// The access token every request must carry (open the page once with ?token=...).
    #[arg(long, env = "TASQ_WEB_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Show the queue without any button: nothing can be changed.
    #[arg(long)]
    pub read_only: bool,
    /// How often to sample the figures for the plots.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub sample_every: Duration,
}

/// `tasq tasks ...`
#[derive(Debug, Subcommand)]
pub enum TasksCommand {
    /// A page of tasks, by id; `--after` the last id shown for the next page.
    List(ListArgs),
    /// One task in full: payload, attempts, errors, lease, dependencies, timeline.
    Show(IdArg),
}

/// `tasq dead ...`
#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// A page of dead letters.
    List(DeadListArgs),
    /// One dead letter in full.
    Show(IdArg),
    /// Retry one dead letter, or every one a filter keeps.
    Retry(BulkArgs),
    /// Purge one dead letter (drop its payload), or every one a filter keeps.
    Purge(BulkArgs),
}

/// A state a task can be in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum State {
    /// Waiting for dependencies.
    Blocked,
    /// Due later.
    Scheduled,
    /// Due, waiting for a worker.
    Ready,
    /// Running.
    Running,
    /// Succeeded.
    Succeeded,
    /// Failed (dead letters among them).
    Failed,
    /// Cancelled.
    Cancelled,
}

impl From<State> for tasq::TaskState {
    fn from(state: State) -> Self {
        match state {
            State::Blocked => tasq::TaskState::Blocked,
            State::Scheduled => tasq::TaskState::Scheduled,
            State::Ready => tasq::TaskState::Ready,
            State::Running => tasq::TaskState::Running,
            State::Succeeded => tasq::TaskState::Succeeded,
            State::Failed => tasq::TaskState::Failed,
            State::Cancelled => tasq::TaskState::Cancelled,
        }
    }
}

/// A task's id: its number in this queue (`42`), or the whole id (`8412:42`).
#[derive(Debug, Args)]
pub struct IdArg {
    /// The task's number in this queue, or its whole id (`<queue id>:<number>`).
    pub id: String,
}

/// `tasq tasks list`
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only tasks in this state.
    #[arg(long, value_enum)]
    pub state: Option<State>,
    /// Only tasks of this type.
    #[arg(long = "type", value_name = "TYPE")]
    pub task_type: Option<String>,
    /// Only tasks in this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Only the tasks submitted with this idempotency key.
    #[arg(long)]
    pub key: Option<String>,
    /// Start after this id (the last one of the page before).
    #[arg(long)]
    pub after: Option<String>,
    /// At most this many (1 to 1,000).
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

/// `tasq dead list`
#[derive(Debug, Args)]
pub struct DeadListArgs {
    /// Only dead letters of this type.
    #[arg(long = "type", value_name = "TYPE")]
    pub task_type: Option<String>,
    /// Only dead letters in this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Start after this id (the last one of the page before).
    #[arg(long)]
    pub after: Option<String>,
    /// At most this many (1 to 1,000).
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

/// `tasq dead retry|purge`
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("which").required(true).args(["id", "all"]))]
pub struct BulkArgs {
    /// One dead letter, by id.
    pub id: Option<String>,
    /// Every dead letter the filters keep.
    #[arg(long)]
    pub all: bool,
    /// With --all: only this type.
    #[arg(long = "type", value_name = "TYPE", requires = "all")]
    pub task_type: Option<String>,
    /// With --all: only this queue.
    #[arg(long, requires = "all")]
    pub queue: Option<String>,
    /// With --all: only those whose last error contains this text.
    #[arg(long, requires = "all")]
    pub error: Option<String>,
    /// List what would be done, and do nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `tasq cancel`
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("which").required(true).args(["id", "key"]))]
pub struct CancelArgs {
    /// The task, by id.
    pub id: Option<String>,
    /// The task that holds this idempotency key.
    #[arg(long)]
    pub key: Option<String>,
}

/// What `pause` and `resume` take: exactly one of a queue, a type, a schedule.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("target").required(true).args(["queue", "task_type", "schedule"]))]
pub struct Target {
    /// A queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// A task type.
    #[arg(long = "type", value_name = "TYPE")]
    pub task_type: Option<String>,
    /// A periodic task, by name.
    #[arg(long)]
    pub schedule: Option<String>,
}

/// `tasq limit`
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// The queue (without a limit: list the limits).
    pub queue: Option<String>,
    /// At most this many of its tasks run at once across the fleet, or `none`.
    pub limit: Option<String>,
}

/// `tasq watch`
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// How often to redraw.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Stop after this many frames (for scripts and tests; without it, until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
}
