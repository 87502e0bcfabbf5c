//! The console's reads, listed for the test that reads their plans on a table of 1,000,000
//! rows (`periodic_queries_read_indexes_at_a_million_rows`).

use super::connect::{COUNT_CAP, SCAN};
use super::overview::{DEAD_TYPES, MINUTES, MINUTES_SQL, QUEUES, READY_TYPES, RUNNING, STATES};
use super::tasks::{BY_KEY, ROW_COLUMNS, dead_page, detail_statements, waiting_page};

/// A statement's parameters, as [`statements`] gives them.
pub(crate) type Params = Vec<Box<dyn postgres::types::ToSql + Sync>>;

/// Every statement the console runs to read, with parameters as it gives them, for the test
/// that reads their plans on a table of 1,000,000 rows (`types`: a type's name; `key`: a key).
pub(crate) fn statements(ty: &str) -> Vec<(&'static str, String, Params)> {
    use crate::model::state::TaskState;
    let cap = COUNT_CAP as i64;
    let page = 50_i64;
    let scan = SCAN as i64;
    let (row, dependencies, dependents) = detail_statements();
    let shape =
        |state, by_type| crate::store::postgres::publish::page_of(ROW_COLUMNS, state, by_type);
    let typed = |after: i64, limit: i64| -> Params {
        vec![Box::new(after), Box::new(limit), Box::new(ty.to_owned())]
    };
    let plain = |after: i64, limit: i64| -> Params { vec![Box::new(after), Box::new(limit)] };
    vec![
        ("overview: states", STATES.to_owned(), vec![Box::new(cap)]),
        ("overview: queues", QUEUES.to_owned(), vec![Box::new(cap)]),
        ("overview: running", RUNNING.to_owned(), vec![Box::new(cap)]),
        (
            "overview: ready types",
            READY_TYPES.to_owned(),
            vec![Box::new(cap)],
        ),
        (
            "overview: dead types",
            DEAD_TYPES.to_owned(),
            vec![Box::new(cap)],
        ),
        (
            "overview: minutes",
            MINUTES_SQL.to_owned(),
            vec![Box::new(cap), Box::new(MINUTES)],
        ),
        ("page: all", shape(None, false), plain(0, page)),
        ("page: all, deep", shape(None, false), plain(900_000, page)),
        ("page: ready or scheduled", waiting_page(), plain(0, scan)),
        (
            "page: running",
            shape(Some(TaskState::Running), false),
            plain(0, page),
        ),
        (
            "page: succeeded",
            shape(Some(TaskState::Succeeded), false),
            plain(0, page),
        ),
        (
            "page: failed",
            shape(Some(TaskState::Failed), false),
            plain(0, page),
        ),
        ("page: of a type", shape(None, true), typed(0, page)),
        (
            "page: blocked of a type",
            shape(Some(TaskState::Blocked), true),
            typed(0, page),
        ),
        ("page: dead", dead_page(), plain(0, page)),
        (
            "page: in a queue (scan)",
            shape(Some(TaskState::Succeeded), false),
            plain(0, scan),
        ),
        (
            "page: by key",
            BY_KEY.replace("{columns}", ROW_COLUMNS),
            vec![
                Box::new(0_i64),
                Box::new(page),
                Box::new("order-42".to_owned()),
            ],
        ),
        ("task", row, vec![Box::new(500_000_i64)]),
        (
            "task: dependencies",
            dependencies,
            vec![Box::new(500_000_i64)],
        ),
        ("task: dependents", dependents, vec![Box::new(500_000_i64)]),
    ]
}
