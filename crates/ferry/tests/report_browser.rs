//! The HTML reports in a real browser: headless Chromium, driven over
//! WebDriver, opens a demo's page and a bench's. Each loads with no
//! console error; each chart holds a mark per value of the JSON; the
//! tables' numbers are the JSON's; the bars' axes are named by the cells
//! and mixes, and the timeline has one panel per unit (in postcopy, the
//! share of time each vCPU waited for pages).
//!
//! Needs Debian's chromium and chromium-driver (scripts/setup.sh installs
//! them): it fails without, rather than skip, unless the set-up recorded
//! that this machine cannot have them (no route to Debian's packages).

mod common;
mod webdriver;

use common::{assert_success, skip_unless_set_up_lacks, Ferry};
use serde_json::Value;
use std::path::{Path, PathBuf};
use webdriver::Browser;

/// Each chart: its kind, the marks it declares and those drawn, its SVG's
/// texts, and a timeline's units.
const FIGURES: &str = r#"return [...document.querySelectorAll('figure.chart')].map(f => ({
    kind: f.dataset.kind,
    declared: Number(f.dataset.marks),
    marks: f.querySelectorAll('svg .mark').length,
    no_value: f.querySelectorAll('svg .no-value').length,
    references: f.querySelectorAll('svg .reference').length,
    bands: f.querySelectorAll('svg .band').length,
    panels: f.dataset.panels ? f.dataset.panels.split('|') : [],
    texts: [...f.querySelectorAll('svg text')].map(t => t.textContent.trim()),
}));"#;

/// Each table: its title and its rows' cells.
const TABLES: &str = r#"return Object.fromEntries([...document.querySelectorAll('table.ferry-table')].map(t => [
    t.dataset.title,
    [...t.querySelectorAll('tbody tr')].map(r => [...r.children].map(c => c.textContent)),
]));"#;

fn temp_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferry-report-browser-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Opens `page` and returns its figures and tables, after checking that
/// it logged no error.
fn load(b: &Browser, page: &Path) -> (Vec<Value>, Value) {
    b.open(page).expect("page opens");
    let figures = b.eval(FIGURES).expect("figures");
    let tables = b.eval(TABLES).expect("tables");
    let errors: Vec<_> = b
        .console()
        .expect("console")
        .into_iter()
        .filter(|(level, _)| level == "SEVERE")
        .collect();
    assert!(
        errors.is_empty(),
        "{}: console errors {errors:?}",
        page.display()
    );
    (figures.as_array().cloned().unwrap_or_default(), tables)
}

/// The row of `table` whose first cell is `key`.
fn row<'a>(tables: &'a Value, table: &str, key: &str) -> &'a Vec<Value> {
    tables[table]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r[0] == key))
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("no row {key:?} in table {table:?}: {tables}"))
}

fn texts(fig: &Value) -> Vec<String> {
    fig["texts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|t| t.as_str().map(String::from))
        .collect()
}

#[test]
fn reports_load_in_chromium_and_show_the_jsons_numbers() {
    if let Err(missing) = webdriver::present() {
        return skip_unless_set_up_lacks("the reports in a browser", "chromium", &missing);
    }
    let dir = temp_dir();
    let demo_page = dir.join("demo.html");
    // A quota on a guest that outruns a 32 MiB/s link: rounds, throttle
    // changes and a pause to draw.
    let out = Ferry::new("demo")
        .on("soft")
        .mem("32M")
        .args(&["--converge", "quota", "--bandwidth", "32"])
        .args(&["--report", demo_page.to_str().expect("utf-8")])
        .run();
    assert_success(&out);
    let bench_dir = dir.join("bench");
    let out = Ferry::new("bench converge")
        .on("soft")
        .args(&["--policies", "quota", "--cell", "16M,1,max,100,32"])
        .args(&["--out", bench_dir.to_str().expect("utf-8")])
        .run();
    assert_success(&out);

    let browser = Browser::start().expect("headless chromium");
    // The console is read at all: a probe shows up.
    browser.open(&demo_page).expect("page opens");
    browser
        .eval("console.error('ferry-probe'); return 1;")
        .expect("probe");
    let probe = browser.console().expect("console");
    assert!(
        probe.iter().any(|(_, m)| m.contains("ferry-probe")),
        "the console probe was not read: {probe:?}"
    );

    // The demo: one timeline, a panel per unit, the pause, the JSON's numbers.
    let j = read_json(&demo_page.with_extension("json"));
    let (figures, tables) = load(&browser, &demo_page);
    assert_eq!(figures.len(), 1, "{figures:?}");
    let t = &figures[0];
    assert_eq!(t["kind"], "timeline");
    assert_eq!(t["marks"], t["declared"], "{t}");
    let panels: Vec<String> = serde_json::from_value(t["panels"].clone()).expect("panels");
    let mut expected = vec!["MiB/s", "MiB left to send"];
    if j["throttle_timeline"]
        .as_array()
        .is_some_and(|s| !s.is_empty())
    {
        expected.push("quota per vCPU, MiB/s");
    }
    assert_eq!(panels, expected, "one panel per unit");
    let drawn = texts(t);
    for unit in &panels {
        let n = drawn.iter().filter(|x| *x == unit).count();
        assert_eq!(n, 1, "the {unit:?} panel's axis is drawn once: {drawn:?}");
    }
    assert!(
        t["bands"].as_u64().unwrap_or(0) >= 1,
        "the pause is drawn: {t}"
    );
    assert!(drawn.iter().any(|x| x.starts_with("pause ")), "{drawn:?}");
    // A mark per round in each rate, two per round in what is left (its
    // bytes, sent down to 0), and one per throttle change and vCPU.
    let rounds = j["round_stats"].as_array().expect("rounds");
    let throttle: usize = j["throttle_timeline"].as_array().map_or(0, |steps| {
        steps
            .iter()
            .map(|s| {
                s["vcpu_quota_bytes"]
                    .as_array()
                    .map_or(1, |v| v.len().max(1))
            })
            .sum()
    });
    assert_eq!(
        t["marks"].as_u64(),
        Some((4 * rounds.len() + throttle) as u64),
        "{t}"
    );
    let total = row(&tables, "migration", "total time");
    assert_eq!(
        total[1],
        format!("{:.1} ms", j["total_ms"].as_f64().unwrap())
    );
    for r in rounds {
        let shown = row(&tables, "rounds", &r["round"].to_string());
        assert_eq!(shown[2], r["pages"].to_string(), "{shown:?} against {r}");
    }

    // The bench: table A's and B's bars, named by the cells and mixes.
    let j = read_json(&bench_dir.join("converge-soft.json"));
    let (figures, tables) = load(&browser, &bench_dir.join("report.html"));
    assert_eq!(figures.len(), 2, "{figures:?}");
    let cells = j["results"]["cells"].as_array().expect("cells");
    let (a, b): (Vec<&Value>, Vec<&Value>) = cells.iter().partition(|c| c["cell"]["mix"] == "");
    let runs = |cs: &[&Value]| {
        cs.iter()
            .map(|c| c["results"].as_array().map_or(0, |r| r.len()))
            .sum::<usize>()
    };
    for (fig, cs) in [(&figures[0], &a), (&figures[1], &b)] {
        assert_eq!(fig["kind"], "bars");
        assert_eq!(fig["marks"], fig["declared"], "{fig}");
        // A bar per value, and a labelled mark per run without one.
        assert_eq!(
            fig["marks"].as_u64(),
            Some(runs(cs) as u64),
            "a mark per run: {fig}"
        );
    }
    let drawn = texts(&figures[0]);
    assert!(
        drawn.iter().any(|x| x == "1: 16M 1×max 100% →32"),
        "table A's axis names its cells: {drawn:?}"
    );
    let drawn = texts(&figures[1]);
    for mix in [
        "write-intensive (3W/1R)",
        "read-write-balanced (2W/2R)",
        "read-intensive (1W/3R)",
    ] {
        assert!(
            drawn.iter().any(|x| x == mix),
            "table B's axis names {mix:?}: {drawn:?}"
        );
    }
    assert_eq!(
        figures[1]["references"], 3,
        "the seed's quota figure in each mix"
    );
    // Table D links each run's timeline and summary, files beside the page.
    let links = browser
        .eval("return [...document.querySelectorAll('table.ferry-table td a')].map(a => a.getAttribute('href'));")
        .expect("links");
    let links: Vec<String> = serde_json::from_value(links).expect("hrefs");
    assert_eq!(
        links.len(),
        2 * runs(&cells.iter().collect::<Vec<_>>()),
        "{links:?}"
    );
    for l in &links {
        assert!(bench_dir.join(l).is_file(), "{l} is beside the page");
    }
    postcopy_timeline(&browser, &dir);
    // Table A's time for quota is the JSON's.
    let quota = &a[0]["results"][0];
    let title = tables
        .as_object()
        .and_then(|t| t.keys().find(|k| k.starts_with("A.")))
        .expect("table A")
        .clone();
    let shown = &tables[&title][0];
    let expect = if quota["converged"] == true {
        format!("{:.2}", quota["total_ms"].as_f64().unwrap() / 1e3)
    } else {
        "unconverged".into()
    };
    assert!(
        shown.as_array().unwrap().iter().any(|c| *c == expect),
        "{shown} lacks {expect}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A postcopy demo's timeline: a panel of the time each vCPU waited for
/// pages, a line per vCPU (soft vCPUs fault on their own threads, so each
/// wait is its vCPU's), and a mark per bin of each.
fn postcopy_timeline(browser: &Browser, dir: &Path) {
    let page = dir.join("postcopy.html");
    let out = Ferry::new("demo")
        .on("soft")
        .mem("32M")
        .args(&["--mode", "postcopy", "--unthrottled", "--warmup", "0.3"])
        .args(&["--report", page.to_str().expect("utf-8")])
        .run();
    assert_success(&out);
    let j = read_json(&page.with_extension("json"));
    let (figures, _) = load(browser, &page);
    let t = &figures[0];
    assert_eq!(t["marks"], t["declared"], "{t}");
    let panels: Vec<String> = serde_json::from_value(t["panels"].clone()).expect("panels");
    assert_eq!(
        panels.last().map(String::as_str),
        Some("blocked on pages, % of time"),
        "{panels:?}"
    );
    let blocked = j["postcopy"]["blocked"]
        .as_array()
        .expect("blocked threads");
    let drawn = texts(t);
    let vcpus = j["vcpu_shares"].as_array().map_or(1, Vec::len) as u64;
    for v in 0..vcpus {
        let label = format!("vCPU {v}");
        assert!(
            blocked.iter().any(|b| b["vcpu"] == v) && drawn.contains(&label),
            "{label} waited and is drawn: {blocked:?} {drawn:?}"
        );
    }
    let bins: usize = blocked
        .iter()
        .map(|b| b["blocked_pct"].as_array().map_or(0, Vec::len))
        .sum();
    let rounds = j["round_stats"].as_array().map_or(0, Vec::len);
    assert_eq!(t["marks"].as_u64(), Some((4 * rounds + bins) as u64), "{t}");
    assert!(
        drawn.iter().any(|x| x.starts_with("postcopy ")),
        "{drawn:?}"
    );
}
