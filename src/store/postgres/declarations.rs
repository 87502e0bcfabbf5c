//! How each task type is declared across the fleet, so that a pool declared differently from
//! the others says so instead of going silently its own way.
//!
//! A task's settings (attempts, retry policy, timeout) are fixed when it is submitted, from its
//! type as the *submitting* pool declares it (or the task's own), and every process obeys its
//! row. So a producer declaring a type with 3 attempts caps every task of it at 3, whatever the
//! workers register; and each pool applies its own concurrency and rate limits and its own
//! downstream. Give a type the same `TypeOptions` everywhere (one shared `const`). When a pool
//! is built, it compares each of its types with the declaration the schema records in
//! `tasq_declarations` (the last pool built with that type, and when), reports every difference
//! as an [`Event::DeclarationMismatch`] (and counts it in `Totals::declaration_mismatches`), and
//! records its own: during a rolling deploy that changes a type, the new and the old versions
//! each report the other as they start, and once every pool runs the new one nothing is
//! reported.

use postgres::GenericClient;
use serde_json::{Map, Value, json};

use crate::observe::event::Event;
use crate::store::registry::{Entry, Registry};

use super::rows;

/// What a pool declares of one type, setting by setting (a JSON object, as the schema keeps
/// it): the settings its tasks carry and the gates it applies.
#[derive(Clone, Debug, PartialEq)]
struct Declared(Map<String, Value>);

impl Declared {
    fn of(entry: &Entry, registry: &Registry) -> Declared {
        let settings = entry.settings();
        let value = json!({
            "max_attempts": settings.max_attempts,
            "retry_base_us": rows::micros(settings.retry.base()),
            "retry_cap_us": rows::micros(settings.retry.cap()),
            "timeout_us": settings.timeout.map(rows::micros),
            "concurrency": entry.concurrency,
            "rate_per_second": entry.rate.map(|r| r.starts_per_second()),
            "rate_burst": entry.rate.map(|r| r.burst()),
            "downstream": entry.downstream.map(|d| registry.downstreams[d as usize].0),
        });
        let mut map = value.as_object().cloned().unwrap_or_default();
        // Only a queue other than the default one is named: a declaration recorded before
        // queues existed reads the same as one in the default queue.
        if entry.queue != crate::model::pause::DEFAULT_QUEUE {
            map.insert("queue".to_owned(), json!(entry.queue));
        }
        Declared(map)
    }

    /// How `self` differs from `other`, setting by setting, in name order: `"max_attempts 20
    /// (3)"`. A setting one side lacks (a later version's) counts as null there.
    fn differences(&self, other: &Declared) -> Vec<String> {
        let mut names: Vec<&String> = self.0.keys().chain(other.0.keys()).collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .filter_map(|name| {
                let ours = self.0.get(name).unwrap_or(&Value::Null);
                let theirs = other.0.get(name).unwrap_or(&Value::Null);
                (ours != theirs).then(|| format!("{name} {ours} ({theirs})"))
            })
            .collect()
    }
}

/// Compares each type of `registry` with the declaration the schema records, records this
/// pool's (as `holder`), and returns a [`Event::DeclarationMismatch`] for each that differed.
/// One transaction: the types' rows are locked in name order, so pools built at once do not
/// deadlock, and each sees the declaration the one before it recorded.
pub(super) fn record(
    client: &mut impl GenericClient,
    registry: &Registry,
    holder: &str,
) -> Result<Vec<Event>, postgres::Error> {
    let mut entries: Vec<&Entry> = registry.entries().iter().collect();
    entries.sort_by_key(|entry| entry.name);
    let mut tx = client.transaction()?;
    let mut events = Vec::new();
    for entry in entries {
        let ours = Declared::of(entry, registry);
        let json = Value::Object(ours.0.clone());
        let before = tx.query_opt(
            "WITH old AS (
                 SELECT settings, declared_by,
                        to_char(declared_at, 'YYYY-MM-DD HH24:MI:SS') AS at
                 FROM tasq_declarations WHERE type = $1 FOR UPDATE
             ), new AS (
                 INSERT INTO tasq_declarations (type, settings, declared_by, declared_at)
                 VALUES ($1, $2, $3, now())
                 ON CONFLICT (type) DO UPDATE SET settings = EXCLUDED.settings,
                     declared_by = EXCLUDED.declared_by, declared_at = EXCLUDED.declared_at
             )
             SELECT settings, declared_by, at FROM old",
            &[&entry.name, &json, &holder],
        )?;
        let Some(row) = before else { continue };
        let differences = match row.get::<_, Value>(0) {
            Value::Object(theirs) => ours.differences(&Declared(theirs)),
            _ => vec!["a declaration this version cannot read".to_owned()],
        };
        if !differences.is_empty() {
            let (by, at): (String, String) = (row.get(1), row.get(2));
            events.push(Event::DeclarationMismatch {
                task_type: entry.name,
                differences: differences.join(", "),
                declared_by: format!("{by} at {at} UTC"),
            });
        }
    }
    tx.commit()?;
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(max_attempts: u32, concurrency: Option<u32>) -> Declared {
        let value = json!({
            "max_attempts": max_attempts,
            "retry_base_us": 1_000,
            "timeout_us": null,
            "concurrency": concurrency,
        });
        Declared(value.as_object().cloned().unwrap())
    }

    #[test]
    fn differences_name_each_setting_with_both_values() {
        let ours = declared(20, Some(2));
        assert!(ours.differences(&ours.clone()).is_empty());
        assert_eq!(
            ours.differences(&declared(3, None)),
            ["concurrency 2 (null)", "max_attempts 20 (3)"]
        );
        let mut later = declared(20, Some(2));
        later.0.insert("queue".to_owned(), json!("mail"));
        assert_eq!(later.differences(&ours), ["queue \"mail\" (null)"]);
    }
}
