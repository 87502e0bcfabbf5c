//! The figures over time, for the overview's plots: a sample of the queue every interval,
//! the newest [`KEEP`] kept. The queue itself keeps no history of its depth; the dashboard
//! that samples it does, from the time it started.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tasq::console::Overview;

/// Samples kept: an hour at one every 10 seconds.
pub const KEEP: usize = 360;

/// One sample: when, and each queue's depth and oldest ready age (`""` is every queue).
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The database's time of the sample.
    pub at: SystemTime,
    /// Per queue (`""` for the whole queue): ready tasks, the oldest's age in seconds.
    pub queues: BTreeMap<String, (usize, f64)>,
}

impl Sample {
    /// The sample of an overview.
    pub fn of(overview: &Overview) -> Sample {
        let mut queues = BTreeMap::new();
        queues.insert(
            String::new(),
            (
                overview.states.ready,
                overview.oldest_ready.map_or(0.0, |d| d.as_secs_f64()),
            ),
        );
        for q in &overview.queues {
            queues.insert(
                q.name.clone(),
                (q.ready, q.oldest_ready.map_or(0.0, |d| d.as_secs_f64())),
            );
        }
        Sample {
            at: overview.at,
            queues,
        }
    }
}

/// The samples, oldest first.
#[derive(Debug, Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    /// Adds a sample, dropping the oldest past [`KEEP`].
    pub fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.push_back(sample);
        while samples.len() > KEEP {
            samples.pop_front();
        }
    }

    /// One queue's series (`""`: the whole queue): (seconds before the newest sample, ready,
    /// oldest age in seconds), oldest first. A sample without the queue counts it empty.
    pub fn series(&self, queue: &str) -> Vec<(f64, f64, f64)> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let Some(newest) = samples.back().map(|s| s.at) else {
            return Vec::new();
        };
        samples
            .iter()
            .map(|s| {
                let before = newest.duration_since(s.at).unwrap_or(Duration::ZERO);
                let (ready, age) = s.queues.get(queue).copied().unwrap_or((0, 0.0));
                (-before.as_secs_f64(), ready as f64, age)
            })
            .collect()
    }

    /// How many samples there are.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.samples.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(secs: u64, ready: usize) -> Sample {
        Sample {
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
            queues: BTreeMap::from([(String::new(), (ready, 1.5))]),
        }
    }

    #[test]
    fn keeps_the_newest_and_reads_them_back_in_order() {
        let history = History::default();
        for i in 0..(KEEP as u64 + 5) {
            history.push(sample(i * 10, i as usize));
        }
        assert_eq!(history.len(), KEEP);
        let series = history.series("");
        assert_eq!(series.len(), KEEP);
        assert_eq!(series.last().unwrap(), &(0.0, (KEEP + 4) as f64, 1.5));
        assert_eq!(series[0].0, -((KEEP as f64 - 1.0) * 10.0));
        assert!(series.windows(2).all(|w| w[0].0 < w[1].0));
        // A queue the samples do not hold is empty throughout.
        assert!(history.series("mail").iter().all(|p| p.1 == 0.0));
    }
}
