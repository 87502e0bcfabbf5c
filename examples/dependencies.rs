//! Dependencies: a download → parse → index pipeline built with `.after([ids])`. Each parse waits
//! for its download; each index waits for two parses (a fan-in). One download fails, so the tasks
//! downstream of it end cancelled instead of running.
//!
//! Run it with `cargo run --example dependencies`.

use std::collections::{BTreeSet, HashMap};
use std::error::Error;
use std::sync::{Arc, Mutex};

use tasq::{CancelReason, HandlerError, Outcome, Pool, TaskHandle, TaskType};

const DOWNLOAD: TaskType<&'static str, usize> = TaskType::new("download"); // -> bytes
const PARSE: TaskType<&'static str, usize> = TaskType::new("parse"); // -> words
const INDEX: TaskType<[&'static str; 2], usize> = TaskType::new("index"); // -> distinct words

/// The (simulated) web server: c.html was taken down.
fn serve(url: &str) -> Option<&'static str> {
    match url {
        "a.html" => Some("the quick brown fox"),
        "b.html" => Some("jumps over the lazy dog"),
        _ => None,
    }
}

/// Where each stage leaves its result for the next. A task receives nothing from its
/// dependencies but the guarantee that they succeeded before it started, so what a handler wrote
/// before returning `Ok` is there for its dependents to read.
#[derive(Default)]
struct Disk {
    pages: HashMap<&'static str, &'static str>,
    words: HashMap<&'static str, Vec<&'static str>>,
}

fn main() -> Result<(), Box<dyn Error>> {
    let disk = Arc::new(Mutex::new(Disk::default()));
    let (d1, d2, d3) = (Arc::clone(&disk), Arc::clone(&disk), disk);
    let pool = Pool::builder()
        .workers(2)
        .register(DOWNLOAD, move |_, url: &&'static str| {
            let page =
                serve(url).ok_or_else(|| HandlerError::permanent(format!("HTTP 404: {url}")))?;
            d1.lock().unwrap().pages.insert(url, page);
            Ok(page.len())
        })
        .register(PARSE, move |_, url: &&'static str| {
            let mut disk = d2.lock().unwrap();
            let words: Vec<_> = disk.pages[url].split_whitespace().collect();
            let count = words.len();
            disk.words.insert(url, words);
            Ok(count)
        })
        .register(INDEX, move |_, urls: &[&'static str; 2]| {
            let disk = d3.lock().unwrap();
            let distinct: BTreeSet<_> = urls.iter().flat_map(|url| &disk.words[url]).collect();
            Ok(distinct.len())
        })
        .build()?;

    // Submit the whole graph at once: tasks whose dependencies have not succeeded wait, blocked.
    let pages = ["a.html", "b.html", "c.html"];
    let (mut downloads, mut parses) = (HashMap::new(), HashMap::new());
    for url in pages {
        let download = pool.submit(DOWNLOAD.task(url))?;
        let parse = pool.submit(PARSE.task(url).after([download.id()]))?;
        downloads.insert(url, download);
        parses.insert(url, parse);
    }
    let index = |pair: [&'static str; 2]| {
        pool.submit(INDEX.task(pair).after(pair.map(|url| parses[url].id())))
    };
    let index_ab = index(["a.html", "b.html"])?;
    let index_bc = index(["b.html", "c.html"])?; // shares b's parse with index_ab

    for url in pages {
        let download = report(&format!("download {url}"), "bytes", &downloads[url]);
        let parse = report(&format!("parse {url}"), "words", &parses[url]);
        if url == "c.html" {
            assert!(download.is_failed(), "download c.html");
            let expected = CancelReason::DependencyFailed(downloads[url].id());
            assert_eq!(parse, Outcome::Cancelled(expected), "parse c.html");
        } else {
            assert!(download.is_succeeded() && parse.is_succeeded(), "{url}");
        }
    }
    let ab = report("index a+b", "distinct words", &index_ab);
    assert_eq!(ab, Outcome::Succeeded(8), "index a+b");
    // The cancel cascades: c's parse was cancelled, so the index waiting on it is cancelled too.
    let bc = report("index b+c", "distinct words", &index_bc);
    let expected = CancelReason::DependencyCancelled(parses["c.html"].id());
    assert_eq!(bc, Outcome::Cancelled(expected), "index b+c");
    Ok(())
}

/// Waits for a stage, prints how it ended, and returns the outcome.
fn report(stage: &str, unit: &str, handle: &TaskHandle<usize>) -> Outcome<usize> {
    let outcome = handle.wait();
    let id = handle.id();
    match &outcome {
        Outcome::Succeeded(n) => println!("{stage:16} ({id}) succeeded: {n} {unit}"),
        Outcome::Failed(failure) => println!("{stage:16} ({id}) failed: {failure}"),
        Outcome::Cancelled(reason) => println!("{stage:16} ({id}) cancelled: {reason}"),
    }
    outcome
}
