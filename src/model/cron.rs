//! Cron schedules (feature `cron`): a five-field cron expression read in an IANA time zone, and
//! the daylight-saving rules that turn its local times into slots.
//!
//! `croner` parses the expression and finds the next matching *local* date and time (it is
//! given time-zone-free `NaiveDateTime`s); `chrono-tz` resolves each local time to an instant.
//! Doing the resolution here, rather than inside the cron crate, keeps the daylight-saving rules
//! ours and written down:
//!
//! - **A local time that does not exist** (the spring gap: 02:30 on the day clocks jump from
//!   02:00 to 03:00) resolves to the end of the gap, the first instant the local clock has passed
//!   it (03:00 in the new offset). So a daily 02:30 slot runs once that day, at 03:00. An hourly
//!   `30 * * * *` has slots at 03:00 and 03:30 that day.
//! - **A local time that happens twice** (the autumn fold: 02:30 on the day clocks go from 03:00
//!   back to 02:00) is one slot, at its first pass (the earlier offset). The second pass through
//!   the hour has no slots: an hourly schedule skips it, a daily one runs once.
//! - A slot is an instant: two local times that resolve to the same instant (03:00, and 02:30
//!   moved to 03:00) are one slot.

use std::time::SystemTime;

use chrono::{DateTime, LocalResult, NaiveDateTime, TimeDelta, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds};

/// The most local times a search steps through looking for one that resolves after an instant
/// (each step is one matching local time; only a fold or a gap makes it take more than one).
const MAX_STEPS: usize = 10_000;

/// A cron expression and the time zone it is read in.
#[derive(Clone, Debug)]
pub(crate) struct CronSpec {
    expression: String,
    zone: Tz,
    cron: Cron,
}

impl CronSpec {
    /// Parses `expression` (five fields: minute, hour, day of month, month, day of week; names
    /// like `MON` and `JAN`, ranges, steps, lists and croner's `L`, `#` and `W`) in `zone`, an
    /// IANA name such as `Europe/Berlin` or `UTC`.
    pub(crate) fn parse(expression: &str, zone: &str) -> Result<CronSpec, String> {
        let zone: Tz = zone
            .parse()
            .map_err(|_| format!("has an unknown time zone {zone:?} (an IANA name, like \"Europe/Berlin\" or \"UTC\")"))?;
        let expression = expression.split_whitespace().collect::<Vec<_>>().join(" ");
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .build()
            .parse(&expression)
            .map_err(|e| {
                format!("has a cron expression {expression:?} that does not parse: {e}")
            })?;
        Ok(CronSpec {
            expression,
            zone,
            cron,
        })
    }

    /// The first slot strictly after `t` (see the module docs for how local times resolve).
    pub(crate) fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        let t: DateTime<Utc> = t.into();
        let mut local = t.with_timezone(&self.zone).naive_local();
        for _ in 0..MAX_STEPS {
            let next = self.cron.find_next_occurrence(&local, false).ok()?;
            let at = resolve(self.zone, next)?;
            if at > t {
                return Some(at.into());
            }
            // A fold: this local time resolved to its first pass, before `t`.
            local = next;
        }
        None
    }

    pub(crate) fn definition(&self) -> String {
        format!("cron {} in {}", self.expression, self.zone.name())
    }

    pub(crate) fn from_definition(text: &str) -> Option<CronSpec> {
        let rest = text.strip_prefix("cron ")?;
        let (expression, zone) = rest.rsplit_once(" in ")?;
        CronSpec::parse(expression, zone).ok()
    }
}

/// The instant local time `local` in `zone` stands for: see the module docs.
fn resolve(zone: Tz, local: NaiveDateTime) -> Option<DateTime<Utc>> {
    match zone.from_local_datetime(&local) {
        LocalResult::Single(at) => Some(at.to_utc()),
        LocalResult::Ambiguous(first, _) => Some(first.to_utc()),
        LocalResult::None => {
            // In a gap: the first whole minute after it (every gap in the tz database starts
            // and ends on a whole minute; the longest skipped a day).
            let mut probe = local.with_second(0)?.with_nanosecond(0)?;
            for _ in 0..(2 * 24 * 60) {
                probe = probe.checked_add_signed(TimeDelta::minutes(1))?;
                if let Some(at) = zone.from_local_datetime(&probe).earliest() {
                    return Some(at.to_utc());
                }
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> SystemTime {
        DateTime::parse_from_rfc3339(text).unwrap().to_utc().into()
    }

    fn slots(spec: &CronSpec, from: &str, n: usize) -> Vec<String> {
        let mut at = utc(from);
        (0..n)
            .map(|_| {
                at = spec.next_after(at).unwrap();
                DateTime::<Utc>::from(at).to_rfc3339()
            })
            .collect()
    }

    #[test]
    fn a_daily_slot_in_the_spring_gap_runs_once_at_the_gaps_end() {
        // Europe/Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST (01:00 UTC).
        let daily = CronSpec::parse("30 2 * * *", "Europe/Berlin").unwrap();
        assert_eq!(
            slots(&daily, "2026-03-27T12:00:00Z", 3),
            [
                "2026-03-28T01:30:00+00:00", // 02:30 CET
                "2026-03-29T01:00:00+00:00", // 02:30 does not exist: 03:00 CEST
                "2026-03-30T00:30:00+00:00", // 02:30 CEST
            ]
        );
    }

    #[test]
    fn a_daily_slot_in_the_autumn_fold_runs_once_at_its_first_pass() {
        // Europe/Berlin, 2026-10-25: 03:00 CEST becomes 02:00 CET (01:00 UTC).
        let daily = CronSpec::parse("30 2 * * *", "Europe/Berlin").unwrap();
        assert_eq!(
            slots(&daily, "2026-10-24T12:00:00Z", 2),
            [
                "2026-10-25T00:30:00+00:00", // 02:30 CEST, the first pass
                "2026-10-26T01:30:00+00:00", // 02:30 CET
            ]
        );
        // Asked from inside the second pass, the first pass is behind: tomorrow's is next.
        assert_eq!(
            slots(&daily, "2026-10-25T01:10:00Z", 1),
            ["2026-10-26T01:30:00+00:00"]
        );
    }

    #[test]
    fn an_hourly_schedule_across_both_changes() {
        let hourly = CronSpec::parse("30 * * * *", "Europe/Berlin").unwrap();
        // Spring: 01:30 CET, 02:30 -> 03:00 CEST, 03:30 CEST.
        assert_eq!(
            slots(&hourly, "2026-03-29T00:00:00Z", 3),
            [
                "2026-03-29T00:30:00+00:00",
                "2026-03-29T01:00:00+00:00",
                "2026-03-29T01:30:00+00:00"
            ]
        );
        // Autumn: 01:30 CEST, 02:30 CEST, (02:30 CET is the same local time again), 03:30 CET.
        assert_eq!(
            slots(&hourly, "2026-10-24T23:00:00Z", 3),
            [
                "2026-10-24T23:30:00+00:00",
                "2026-10-25T00:30:00+00:00",
                "2026-10-25T02:30:00+00:00"
            ]
        );
        // A slot at 03:00 and the gap's 02:30 are one instant, one slot.
        let both = CronSpec::parse("0,30 2-3 * * *", "Europe/Berlin").unwrap();
        assert_eq!(
            slots(&both, "2026-03-29T00:00:00Z", 2),
            ["2026-03-29T01:00:00+00:00", "2026-03-29T01:30:00+00:00"]
        );
    }

    #[test]
    fn a_slot_on_a_day_that_was_skipped_runs_when_the_day_ends() {
        // Pacific/Apia skipped 2011-12-30 whole: 2011-12-29 23:59:59 -10:00 was followed by
        // 2011-12-31 00:00:00 +14:00 (10:00 UTC on the 30th).
        let noon = CronSpec::parse("0 12 * * *", "Pacific/Apia").unwrap();
        assert_eq!(
            slots(&noon, "2011-12-29T12:00:00Z", 3),
            [
                "2011-12-29T22:00:00+00:00", // 12:00 -10:00 on the 29th
                "2011-12-30T10:00:00+00:00", // the 30th's noon: when the 31st began
                "2011-12-30T22:00:00+00:00", // 12:00 +14:00 on the 31st
            ]
        );
    }

    #[test]
    fn bad_expressions_and_zones_are_refused_with_a_reason() {
        let zone = CronSpec::parse("* * * * *", "Mars/Olympus").unwrap_err();
        assert!(zone.contains("unknown time zone"), "{zone}");
        let fields = CronSpec::parse("0 * * * * *", "UTC").unwrap_err();
        assert!(fields.contains("does not parse"), "{fields}");
        assert!(CronSpec::parse("61 * * * *", "UTC").is_err());
        assert!(CronSpec::parse("", "UTC").is_err());
    }

    #[test]
    fn definitions_read_back() {
        let spec = CronSpec::parse(" */5   9-17 * * MON-FRI ", "America/New_York").unwrap();
        assert_eq!(
            spec.definition(),
            "cron */5 9-17 * * MON-FRI in America/New_York"
        );
        let back = CronSpec::from_definition(&spec.definition()).unwrap();
        let t = utc("2026-12-04T14:02:00Z");
        assert_eq!(back.next_after(t), spec.next_after(t));
        assert!(CronSpec::from_definition("cron * * * * *").is_none());
    }
}
